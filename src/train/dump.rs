//! Writing sampled blocks as text, keyed by original ids, so tests can check that every rank
//! count and strategy samples the same global mini-batch.

use super::data::TrainData;
use crate::sample::Block;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// Appends to `DIR/blocks-rank<R>.txt`, by original ids (layer 0 = input layer), one line
/// `D step layer dst` per destination this rank computes and one line `E step layer dst src`
/// per edge it aggregates.
pub struct BlockDump {
    out: std::io::BufWriter<std::fs::File>,
}

impl BlockDump {
    /// Create the dump file of `rank` in `dir`.
    pub fn create(dir: &Path, rank: usize) -> Result<BlockDump> {
        let path = dir.join(format!("blocks-rank{rank}.txt"));
        let file = std::fs::File::create(&path)
            .with_context(|| format!("cannot create block dump `{}`", path.display()))?;
        Ok(BlockDump {
            out: std::io::BufWriter::new(file),
        })
    }

    /// Write the edges of one step's blocks.
    pub fn write(&mut self, step: u64, blocks: &[Block], data: &TrainData) -> Result<()> {
        for (layer, b) in blocks.iter().enumerate() {
            for i in 0..b.num_dst {
                let dst = data.orig_of(b.src_nodes[i]);
                writeln!(self.out, "D {step} {layer} {dst}")?;
                for &s in b.in_edges(i) {
                    let src = data.orig_of(b.src_nodes[s as usize]);
                    writeln!(self.out, "E {step} {layer} {dst} {src}")?;
                }
            }
        }
        self.out.flush()?;
        Ok(())
    }
}
