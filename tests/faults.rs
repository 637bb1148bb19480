//! Faults a long job meets, injected for real: a rank killed with SIGKILL mid-epoch must end
//! the whole job within a bounded time and leave the last checkpoint intact and resumable
//! (bit for bit the run it interrupted); a checkpoint write that fails (a file-size limit)
//! must keep the previous checkpoint and say why. (A diverging loss is in `train.rs`.)

mod common;

use common::{bits, gnnpar, read_f32s, read_u64_attr, s};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a small run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the job may go on after one of its ranks was killed.
const ABORT_BOUND: Duration = Duration::from_secs(30);

/// Training options shared by the interrupted, the resumed and the uninterrupted runs: the
/// synthetic default in small batches, so an epoch has many steps; a checkpoint every epoch.
const OPTIONS: [&str; 10] = [
    "--batch-size",
    "64",
    "--hidden",
    "32",
    "--eval-every",
    "0",
    "--checkpoint-every",
    "1",
    "--threads",
    "1",
];

/// `gnnpar train` options with the checkpoint at `ck` and `epochs` epochs.
fn train_args<'a>(ck: &'a Path, epochs: &'a str) -> Vec<&'a str> {
    let mut args = vec!["train", "--epochs", epochs, "--checkpoint", s(ck)];
    args.extend_from_slice(&OPTIONS);
    args
}

/// The direct children of `parent` named `gnnpar` (mpirun starts its local ranks itself).
fn gnnpar_children(parent: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid == Some(parent) && head.ends_with("(gnnpar") {
            pids.push(pid);
        }
    }
    pids.sort();
    pids
}

/// The `epoch` attribute of a checkpoint, when the file exists and reads.
fn checkpoint_epoch(ck: &Path) -> Option<u64> {
    let file = hdf5::File::open(ck).ok()?;
    file.attr("epoch").ok()?.read_scalar::<u64>().ok()
}

#[test]
fn a_rank_killed_mid_epoch_ends_the_job_and_its_checkpoint_resumes_exactly() {
    let test = "a_rank_killed_mid_epoch_ends_the_job_and_its_checkpoint_resumes_exactly";
    if !common::have_mpirun(test) {
        return;
    }
    let tmp = common::tempdir();
    let ck = tmp.path().join("ck.h5");
    // Far more epochs than will run: the job is killed once two checkpoints are written.
    let mut cmd = common::mpirun_command(2, &train_args(&ck, "500"));
    let session = common::own_mpi_session(&mut cmd);
    let mut job = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start mpirun");
    let started = Instant::now();
    while checkpoint_epoch(&ck).is_none_or(|e| e < 2) {
        assert!(
            started.elapsed() < RUN_TIMEOUT,
            "no checkpoint of epoch 2 within {RUN_TIMEOUT:?}"
        );
        if let Some(status) = job.try_wait().unwrap() {
            panic!("the job ended before it was killed: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ranks = gnnpar_children(job.id());
    assert_eq!(
        ranks.len(),
        2,
        "expected 2 gnnpar ranks under mpirun, found {ranks:?}"
    );
    // SIGKILL rank 1: it cannot clean up or tell anyone; the launcher must end the job.
    let killed_at = Instant::now();
    let rc = unsafe { libc::kill(ranks[1] as i32, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill -9 {} failed", ranks[1]);
    let status = loop {
        if let Some(status) = job.try_wait().unwrap() {
            break status;
        }
        if killed_at.elapsed() > ABORT_BOUND {
            let _ = job.kill();
            for pid in gnnpar_children(job.id()) {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            panic!("the job still ran {ABORT_BOUND:?} after a rank was killed (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = std::fs::remove_dir_all(&session);
    let mut stderr = String::new();
    std::io::Read::read_to_string(job.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(
        !status.success(),
        "a job with a killed rank reported success:\n{stderr}"
    );
    assert!(
        gnnpar_children(job.id()).is_empty(),
        "ranks outlived their job"
    );

    // The last checkpoint is whole: resume it to one more epoch, and compare with a run that
    // was never interrupted.
    let epoch = read_u64_attr(&ck, "epoch");
    assert!(epoch >= 2, "checkpoint at epoch {epoch}");
    let target = (epoch + 1).to_string();
    let mut resume = train_args(&ck, &target);
    resume.push("--resume");
    let out = common::run_with_timeout(common::mpirun_command(2, &resume), RUN_TIMEOUT)
        .expect_ok("resume from the checkpoint of the killed job");
    assert!(out
        .stderr
        .contains(&format!("resumed from `{}` at epoch {epoch}", ck.display())));
    let fresh = tmp.path().join("fresh.h5");
    common::run_with_timeout(
        common::mpirun_command(2, &train_args(&fresh, &target)),
        RUN_TIMEOUT,
    )
    .expect_ok("uninterrupted run");
    assert!(
        bits(&read_f32s(&ck, "params")) == bits(&read_f32s(&fresh, "params")),
        "the resumed run differs from the uninterrupted one"
    );
}

/// `gnnpar <args>` under `ulimit -f <kib>` (bash counts 1024-byte blocks).
fn gnnpar_with_file_limit(kib: u64, args: &[&str]) -> common::Outcome {
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!("ulimit -f {kib} && exec \"$0\" \"$@\""))
        .arg(common::GNNPAR)
        .args(args)
        .env("RUST_LOG", "info");
    common::run_with_timeout(cmd, RUN_TIMEOUT)
}

fn leftovers(dir: &Path, keep: &[&PathBuf]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| !keep.contains(&p))
        .map(|p| p.display().to_string())
        .collect()
}

#[test]
fn a_failed_checkpoint_write_keeps_the_previous_checkpoint_and_says_why() {
    let tmp = common::tempdir();
    let ck = tmp.path().join("ck.h5");
    gnnpar(&train_args(&ck, "1"), RUN_TIMEOUT).expect_ok("first epoch");
    let before = bits(&read_f32s(&ck, "params"));
    let size_kib = std::fs::metadata(&ck).unwrap().len() / 1024;
    assert!(
        size_kib > 8,
        "checkpoint of {size_kib} KiB is too small for this test"
    );

    // Resume under a file-size limit of half the checkpoint: the next write must fail.
    let mut args = train_args(&ck, "3");
    args.push("--resume");
    let out = gnnpar_with_file_limit(size_kib / 2, &args);
    assert!(
        !out.success,
        "the write past the file-size limit succeeded:\n{}",
        out.stderr
    );
    assert_eq!(
        out.code,
        Some(1),
        "killed instead of failing cleanly:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("cannot write checkpoint") && out.stderr.contains("File too large"),
        "the error does not say why:\n{}",
        out.stderr
    );
    assert!(
        before == bits(&read_f32s(&ck, "params")),
        "the previous checkpoint changed"
    );
    assert_eq!(read_u64_attr(&ck, "epoch"), 1);
    assert!(
        leftovers(tmp.path(), &[&ck]).is_empty(),
        "temporary files left behind: {:?}",
        leftovers(tmp.path(), &[&ck])
    );
    // And it still resumes.
    gnnpar(&args, RUN_TIMEOUT).expect_ok("resume after the failed write");
    assert_eq!(read_u64_attr(&ck, "epoch"), 3);
}
