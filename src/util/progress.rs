//! Progress reporting: a bar on a terminal, plain log lines otherwise (Slurm output files are
//! not terminals, and a bar would fill them with control characters).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// A progress reporter over `total` units of work.
pub struct Progress {
    bar: Option<ProgressBar>,
    what: String,
    total: u64,
    done: u64,
    last_log: Instant,
    started: Instant,
}

impl Progress {
    /// Start reporting progress of `what` over `total` units.
    pub fn new(what: &str, total: u64) -> Self {
        let bar = if std::io::stderr().is_terminal() && !log::log_enabled!(log::Level::Debug) {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} ({eta})")
                    .expect("static progress template is valid")
                    .progress_chars("=> "),
            );
            bar.set_message(what.to_string());
            Some(bar)
        } else {
            None
        };
        Progress {
            bar,
            what: what.to_string(),
            total,
            done: 0,
            last_log: Instant::now(),
            started: Instant::now(),
        }
    }

    /// Advance by `n` units. Without a terminal, logs at most every 10 seconds.
    pub fn inc(&mut self, n: u64) {
        self.done += n;
        match &self.bar {
            Some(bar) => bar.inc(n),
            None => {
                if self.last_log.elapsed() >= Duration::from_secs(10) {
                    self.last_log = Instant::now();
                    log::info!(
                        "{}: {}/{} ({:.0}%)",
                        self.what,
                        self.done,
                        self.total,
                        100.0 * self.done as f64 / self.total.max(1) as f64
                    );
                }
            }
        }
    }

    /// Finish and return the elapsed seconds.
    pub fn finish(self) -> f64 {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        self.started.elapsed().as_secs_f64()
    }
}
