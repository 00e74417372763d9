//! What the device did, per tenant and in all, and its Prometheus families.

use crate::device::budget::BudgetSnapshot;
use hapi_wire::profile::DeviceMemory;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Per tenant, what the device did for it.
#[derive(Debug, Default, Clone)]
pub struct TenantStats {
    pub calls: u64,
    pub samples: u64,
    pub queued_seconds: f64,
    pub device_seconds: f64,
    /// Sum over this tenant's slices of the size of the batch they ran in.
    pub batch_samples: u64,
    pub slices: u64,
    pub refused: u64,
    pub expired: u64,
}

#[derive(Debug, Default)]
pub struct Stats {
    pub tenants: BTreeMap<String, TenantStats>,
    pub batches: u64,
    pub batch_samples: u64,
    pub largest_batch: i64,
    pub in_progress: u64,
    pub peak_in_progress: u64,
    /// Pooled batches running now, and the most at once.
    pub running: u64,
    pub peak_running: u64,
    pub faults: u64,
}

impl Stats {
    pub fn tenant(&mut self, name: &str) -> &mut TenantStats {
        self.tenants.entry(name.to_string()).or_default()
    }

    /// A pooled batch went to a worker.
    pub fn started(&mut self) {
        self.running += 1;
        self.peak_running = self.peak_running.max(self.running);
    }

    /// A pooled batch came back from its worker.
    pub fn finished(&mut self) {
        self.running = self.running.saturating_sub(1);
    }

    /// One device batch of `size` samples made of slices of these tenants' calls.
    pub fn batch<'a>(&mut self, tenants: impl Iterator<Item = &'a str>, size: i64) {
        self.batches += 1;
        self.batch_samples += size as u64;
        self.largest_batch = self.largest_batch.max(size);
        for t in tenants {
            let s = self.tenant(t);
            s.batch_samples += size as u64;
            s.slices += 1;
        }
    }

    pub fn memory(&self, b: &BudgetSnapshot) -> DeviceMemory {
        DeviceMemory {
            budget: b.total,
            reserved: b.reserved,
            weights: b.weights,
            peak_bytes: b.peak,
            loaded_models: b.loaded,
            evictions: b.evictions,
            loads: b.loads,
            deferred_loads: b.deferred,
            in_progress: self.in_progress,
            peak_in_progress: self.peak_in_progress,
            batches: self.batches,
            batch_samples: self.batch_samples,
            largest_batch: self.largest_batch,
            running_batches: self.running,
            peak_running_batches: self.peak_running,
        }
    }

    /// The device's families in the Prometheus text format.
    pub fn render(&self, m: &DeviceMemory, out: &mut String) {
        let gauges: [(&str, &str, f64); 11] = [
            (
                "hapi_device_budget_bytes",
                "Device memory budget.",
                m.budget as f64,
            ),
            (
                "hapi_device_weights_bytes",
                "Weights of loaded models charged to the budget.",
                m.weights as f64,
            ),
            (
                "hapi_device_reserved_bytes",
                "Device memory reserved by running batches.",
                m.reserved as f64,
            ),
            (
                "hapi_device_peak_bytes",
                "Most device memory held at once (weights and batches).",
                m.peak_bytes as f64,
            ),
            (
                "hapi_device_loaded_models",
                "Models loaded now.",
                m.loaded_models as f64,
            ),
            (
                "hapi_device_calls_in_progress",
                "Compute calls admitted to the device and not finished.",
                m.in_progress as f64,
            ),
            (
                "hapi_device_calls_peak",
                "Most compute calls admitted to the device at once.",
                m.peak_in_progress as f64,
            ),
            (
                "hapi_device_largest_batch",
                "Largest device batch, in samples.",
                m.largest_batch as f64,
            ),
            (
                "hapi_device_batches_running",
                "Pooled device batches running now.",
                m.running_batches as f64,
            ),
            (
                "hapi_device_batches_running_peak",
                "Most pooled device batches that ran at once.",
                m.peak_running_batches as f64,
            ),
            (
                "hapi_device_faults",
                "Device batches that failed with a host fault (libtorch error or panic).",
                self.faults as f64,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let counters: [(&str, &str, u64); 5] = [
            (
                "hapi_device_batches_total",
                "Device batches run.",
                m.batches,
            ),
            (
                "hapi_device_batch_samples_total",
                "Samples in device batches.",
                m.batch_samples,
            ),
            (
                "hapi_device_evictions_total",
                "Idle models unloaded to make room.",
                m.evictions,
            ),
            ("hapi_device_loads_total", "Model loads started.", m.loads),
            (
                "hapi_device_deferred_loads_total",
                "Loads that waited because other tenants' models, each tenant within its share \
                 of the budget, held the room.",
                m.deferred_loads,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        type F = fn(&TenantStats) -> String;
        let families: [(&str, &str, F); 8] = [
            ("hapi_device_calls_total", "Compute calls by tenant.", |t| {
                t.calls.to_string()
            }),
            (
                "hapi_device_samples_total",
                "Samples computed by tenant.",
                |t| t.samples.to_string(),
            ),
            (
                "hapi_device_queue_seconds_total",
                "Time compute calls waited for the device (memory, batch mates, other tenants' turns).",
                |t| t.queued_seconds.to_string(),
            ),
            (
                "hapi_device_seconds_total",
                "Device time by tenant (a pooled batch's time shared by samples).",
                |t| t.device_seconds.to_string(),
            ),
            (
                "hapi_device_tenant_batch_samples_total",
                "Sum of the sizes of the batches a tenant's slices ran in (divide by slices for the mean).",
                |t| t.batch_samples.to_string(),
            ),
            (
                "hapi_device_slices_total",
                "Slices of a tenant's calls run in device batches.",
                |t| t.slices.to_string(),
            ),
            (
                "hapi_device_refused_total",
                "Compute calls refused (could not fit, or no room with adaptation off).",
                |t| t.refused.to_string(),
            ),
            (
                "hapi_device_expired_total",
                "Compute calls abandoned at their deadline.",
                |t| t.expired.to_string(),
            ),
        ];
        for (name, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (tenant, t) in &self.tenants {
                let _ = writeln!(
                    out,
                    "{name}{{tenant=\"{}\"}} {}",
                    crate::metrics::escape(tenant),
                    value(t)
                );
            }
        }
    }
}
