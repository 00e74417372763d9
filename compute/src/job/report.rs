//! Results JSON and what a job prints.

use crate::plan::Split;
use anyhow::Context;
use serde::Serialize;
use std::path::Path;

use super::config::{EpochResult, PlanReport};

/// Writes `value` as pretty JSON, atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

pub(super) fn ms(s: f64) -> String {
    format!("{:.1}", s * 1e3)
}

/// Prints the plan: measured inputs and every split's estimate.
pub fn print_plan(p: &PlanReport) {
    let c = &p.costs;
    eprintln!(
        "plan ({:.1} s of measuring): bandwidth {:.1} MB/s, request latency {} ms, host read {} and decode {} ms/sample, local decode {} ms/sample, store read {:.1} MB/s, head step {} ms",
        p.plan_s,
        c.bandwidth / 1e6,
        ms(c.latency),
        ms(c.host_read),
        ms(c.host_decode),
        ms(c.local_decode),
        c.store_bandwidth / 1e6,
        ms(c.head_step),
    );
    eprintln!("  split  storage ms/it  compute ms/it  epoch s  MB/it   fits");
    for e in &p.estimates {
        let mb = match e.split {
            Split::None => c.object_bytes * c.batch as f64 / 1e6,
            Split::At(s) => (c.bytes_at[s] * c.batch as u64) as f64 / 1e6,
        };
        eprintln!(
            "  {:>5}  {:>13}  {:>13}  {:>7.2}  {:>6.2}  {}{}",
            e.split.to_string(),
            ms(e.storage),
            ms(e.compute),
            e.epoch,
            mb,
            if e.fits { "yes" } else { "no" },
            if e.split == p.chosen {
                "  <- the model's best"
            } else if p.candidates.contains(&e.split) {
                "  <- explored"
            } else {
                ""
            },
        );
    }
    eprintln!(
        "  exploring splits {} on training iterations",
        p.candidates
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
}
/// One line per storage host: what it answered, what failed there, whether it is out.
pub(super) fn print_hosts(hosts: &[hapi_client::HostStats], hedges: u64) {
    for h in hosts {
        eprintln!(
            "  host {}: {} answered, {} failed, ejected {} times{}{}{}",
            h.host,
            h.answered,
            h.failed,
            h.ejections,
            h.per_key_s
                .map_or_else(String::new, |s| format!(", {} ms per key", ms(s))),
            if h.ejected { ", out now" } else { "" },
            h.last_failure
                .as_ref()
                .map_or_else(String::new, |f| format!(" (last failure: {f})")),
        );
    }
    if hedges > 0 {
        eprintln!("  {hedges} requests sent to a second host because the first was slow");
    }
}

pub(super) fn print_epoch(r: &EpochResult, epochs: usize) {
    let pred = r.predicted.map_or_else(String::new, |p| {
        format!(" (predicted {} / {} ms)", ms(p.storage), ms(p.compute))
    });
    eprintln!(
        "epoch {}/{epochs}: split {}, {} it, {:.1} s, {:.0} samples/s, storage stage {} ms/it, compute stage {} ms/it{pred}, {:.1} MB received, loss {:.4}{}{}{}",
        r.epoch + 1,
        r.split,
        r.iterations,
        r.wall_s,
        r.samples as f64 / r.wall_s.max(1e-9),
        ms(r.storage_stage_s),
        ms(r.compute_stage_s),
        r.bytes_received as f64 / 1e6,
        r.train_loss,
        r.test_accuracy.map_or_else(String::new, |a| format!(
            ", test accuracy {:.2}%",
            a * 100.0
        )),
        if r.skipped.is_empty() {
            String::new()
        } else {
            format!(", {} bad objects skipped", r.skipped.len())
        },
        if r.from_cache {
            ", features from memory or the feature store"
        } else {
            ""
        },
    );
    let counts = crate::pipeline::split_counts(r.trace.iter().map(|i| i.split));
    if counts.len() > 1 {
        eprintln!(
            "  iterations per split: {}",
            counts
                .iter()
                .map(|(s, n)| format!("{s}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}
