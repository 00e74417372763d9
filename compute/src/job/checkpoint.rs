//! Per-epoch checkpoints (`--checkpoint`, `--resume`), written atomically.

use crate::plan::Split;
use anyhow::{Context, bail};
use hapi_client::WireDtype;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use super::config::Results;
use super::train::Job;

/// What the checkpoint directory's `state.json` holds.
#[derive(Serialize, Deserialize)]
pub(super) struct CheckpointState {
    fingerprint: String,
    pub(super) epochs_done: usize,
    pub(super) results: Results,
    pub(super) split: Split,
}

impl Job {
    pub(super) fn fingerprint(&self) -> String {
        let c = &self.cfg;
        format!(
            "model={} freeze={} classes={:?} train={} test={} seed={} batch={} opt={:?} lr={} first={:?}",
            c.model,
            self.freeze,
            self.data.classes,
            self.data.train.len(),
            self.data.test.len(),
            c.seed,
            c.batch,
            c.optimizer,
            c.lr,
            self.data.train.first().map(|s| &s.key),
        ) + &match c.wire_dtype {
            WireDtype::F32 => String::new(),
            other => format!(" wire={other}"),
        }
    }

    pub(super) fn latest_checkpoint(&self) -> anyhow::Result<Option<(PathBuf, CheckpointState)>> {
        let Some(dir) = &self.cfg.checkpoint else {
            bail!("--resume needs --checkpoint DIR");
        };
        let best = if dir.is_dir() {
            epoch_dirs(dir)?.into_iter().max_by_key(|(n, _)| *n)
        } else {
            None
        };
        let Some((_, path)) = best else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path.join("state.json"))
            .with_context(|| format!("reading {}", path.join("state.json").display()))?;
        let state: CheckpointState = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", path.join("state.json").display()))?;
        let mine = self.fingerprint();
        if state.fingerprint != mine {
            bail!(
                "the checkpoint in {} is from a different job:\n  it has: {}\n  this job: {mine}",
                path.display(),
                state.fingerprint
            );
        }
        Ok(Some((path, state)))
    }

    /// Writes `epoch-NNNN/` atomically (a temporary directory renamed into place) and removes
    /// older epochs.
    pub(super) fn write_checkpoint(
        &self,
        epochs_done: usize,
        split: Split,
        results: &Results,
    ) -> anyhow::Result<()> {
        let Some(dir) = &self.cfg.checkpoint else {
            return Ok(());
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = dir.join(format!(".epoch-{epochs_done:04}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        self.head.save(&tmp)?;
        let state = CheckpointState {
            fingerprint: self.fingerprint(),
            epochs_done,
            results: results.clone(),
            split,
        };
        std::fs::write(tmp.join("state.json"), serde_json::to_vec_pretty(&state)?)?;
        let final_dir = dir.join(format!("epoch-{epochs_done:04}"));
        let _ = std::fs::remove_dir_all(&final_dir);
        std::fs::rename(&tmp, &final_dir)
            .with_context(|| format!("moving the checkpoint into {}", final_dir.display()))?;
        for (n, path) in epoch_dirs(dir)? {
            if n < epochs_done {
                let _ = std::fs::remove_dir_all(path);
            }
        }
        Ok(())
    }
}

/// The `epoch-NNNN` directories in `dir`, with their epoch counts.
fn epoch_dirs(dir: &Path) -> std::io::Result<Vec<(usize, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(n) = name
            .strip_prefix("epoch-")
            .and_then(|n| n.parse::<usize>().ok())
        {
            out.push((n, e.path()));
        }
    }
    Ok(out)
}
