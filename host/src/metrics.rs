//! Prometheus metrics, in the text exposition format.

use crate::locks::lock;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Default, Clone, Copy)]
struct Series {
    count: u64,
    seconds: f64,
    compute_seconds: f64,
    read_bytes: u64,
    output_bytes: u64,
}

/// A metric family: name, type, help and how to read it from a series.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Series) -> String,
);

/// The outcome code of an invocation stopped because its client closed the connection.
pub const CLIENT_CLOSED: &str = "client_closed";

/// The `function` label of a tenant's series of functions it removed (no function can have
/// this name).
pub const REMOVED: &str = "(removed)";

/// A refused request's tenant, endpoint and code.
type Refusal = (String, &'static str, &'static str);

/// Uploads a tenant made: how many, and the compiler's seconds.
type Uploads = (u64, f64);

/// A metric family of uploads: name, help and how to read it.
type UploadFamily = (&'static str, &'static str, fn(&Uploads) -> String);

/// Per tenant, function and outcome code; and per tenant, what the host refused and what it
/// compiled on the tenant's behalf.
#[derive(Debug, Default)]
pub struct Metrics {
    series: Mutex<BTreeMap<(String, String, String), Series>>,
    /// Requests answered with an error before they ran, by tenant, endpoint and code.
    refused: Mutex<BTreeMap<Refusal, u64>>,
    /// Uploads taken to the compiler, by tenant and outcome code: how many, and the seconds
    /// spent checking, compiling and preparing them.
    uploads: Mutex<BTreeMap<(String, &'static str), Uploads>>,
    /// Requests refused before a tenant was known (no token, a token of no tenant, not the
    /// operator's), by code.
    unauthenticated: Mutex<BTreeMap<&'static str, u64>>,
}

/// One finished invocation, as metrics see it.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    pub tenant: &'a str,
    pub function: &'a str,
    pub code: &'a str,
    pub total: Duration,
    pub compute: Duration,
    pub read_bytes: u64,
    pub output_bytes: u64,
}

pub(crate) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// Counts an invocation under its function, then folds the function's series into
    /// [`REMOVED`] if `deployed` says it is gone: an invocation that outlives its function's
    /// removal cannot bring back a series the removal folded (deploy, invoke, remove under ever
    /// new names would grow the metrics without bound). Asked after counting, either order of
    /// the removal and this call ends folded; no lock is held while asking.
    pub fn observe(&self, o: Observation<'_>, deployed: impl FnOnce() -> bool) {
        self.count(&o);
        if !deployed() {
            self.fold(o.tenant, o.function);
        }
    }

    fn count(&self, o: &Observation<'_>) {
        let mut map = lock(&self.series);
        let s = map
            .entry((
                o.tenant.to_string(),
                o.function.to_string(),
                o.code.to_string(),
            ))
            .or_default();
        s.count += 1;
        s.seconds += o.total.as_secs_f64();
        s.compute_seconds += o.compute.as_secs_f64();
        s.read_bytes += o.read_bytes;
        s.output_bytes += o.output_bytes;
    }

    /// A request of `tenant` to `endpoint` answered `code` before it ran (no slot, no such
    /// function, a body that could not be read or parsed, a quota).
    pub fn refused(&self, tenant: &str, endpoint: &'static str, code: &'static str) {
        let mut map = lock(&self.refused);
        *map.entry((tenant.to_string(), endpoint, code)).or_default() += 1;
    }

    /// A request refused with `code` before a tenant (or the operator) was known.
    pub fn unauthenticated(&self, code: &'static str) {
        let mut map = lock(&self.unauthenticated);
        *map.entry(code).or_default() += 1;
    }

    /// An upload of `tenant` that the compiler took, ending with `code` (`ok`, or why it was
    /// rejected) after `spent` on the host's compile threads.
    pub fn uploaded(&self, tenant: &str, code: &'static str, spent: Duration) {
        let mut map = lock(&self.uploads);
        let e = map.entry((tenant.to_string(), code)).or_default();
        e.0 += 1;
        e.1 += spent.as_secs_f64();
    }

    /// Folds the series of `tenant`'s `function` into the tenant's [`REMOVED`] series, when
    /// the function is removed: the tenant's totals stay, and a tenant that deploys, invokes
    /// and removes functions under ever new names does not grow the metrics without bound.
    pub fn fold(&self, tenant: &str, function: &str) {
        let mut map = lock(&self.series);
        let start = (tenant.to_string(), function.to_string(), String::new());
        let keys: Vec<(String, String, String)> = map
            .range(start..)
            .take_while(|((t, f, _), _)| t == tenant && f == function)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let Some(s) = map.remove(&key) else { continue };
            let into = map.entry((key.0, REMOVED.to_string(), key.2)).or_default();
            into.count += s.count;
            into.seconds += s.seconds;
            into.compute_seconds += s.compute_seconds;
            into.read_bytes += s.read_bytes;
            into.output_bytes += s.output_bytes;
        }
    }

    /// The metrics in the text exposition format. Each map is copied under its lock and
    /// written out after: every invocation's end takes the series' lock ([`Self::observe`]),
    /// and a scrape that wrote out every series under it held each of them up for as long.
    pub fn render(&self) -> String {
        let map = lock(&self.series).clone();
        let refused = lock(&self.refused).clone();
        let unauthenticated = lock(&self.unauthenticated).clone();
        let uploads = lock(&self.uploads).clone();
        let mut out = String::new();
        let families: [Family; 5] = [
            (
                "hapi_invocations_total",
                "counter",
                "Invocations by tenant, function and outcome code.",
                |s| s.count.to_string(),
            ),
            (
                "hapi_invocation_seconds_total",
                "counter",
                "Wall time of invocations.",
                |s| s.seconds.to_string(),
            ),
            (
                "hapi_compute_seconds_total",
                "counter",
                "Time in model segments (wasi-nn compute).",
                |s| s.compute_seconds.to_string(),
            ),
            (
                "hapi_read_bytes_total",
                "counter",
                "Object bytes read by invocations.",
                |s| s.read_bytes.to_string(),
            ),
            (
                "hapi_output_bytes_total",
                "counter",
                "Tensor bytes returned by invocations.",
                |s| s.output_bytes.to_string(),
            ),
        ];
        let _ = writeln!(
            out,
            "# HELP hapi_process_resident_bytes Resident memory of the host process.\n# TYPE hapi_process_resident_bytes gauge\nhapi_process_resident_bytes {}",
            crate::memory::rss::current()
        );
        for (name, kind, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for ((tenant, function, code), s) in map.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{tenant=\"{}\",function=\"{}\",code=\"{}\"}} {}",
                    escape(tenant),
                    escape(function),
                    escape(code),
                    value(s)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP hapi_refused_total Requests answered with an error before they ran, by tenant, endpoint and code.\n# TYPE hapi_refused_total counter"
        );
        for ((tenant, endpoint, code), n) in refused.iter() {
            let _ = writeln!(
                out,
                "hapi_refused_total{{tenant=\"{}\",endpoint=\"{endpoint}\",code=\"{code}\"}} {n}",
                escape(tenant)
            );
        }
        let _ = writeln!(
            out,
            "# HELP hapi_unauthenticated_total Requests refused before a tenant or the operator was known (no token, a token of no tenant, not the operator's), by code.\n# TYPE hapi_unauthenticated_total counter"
        );
        for (code, n) in unauthenticated.iter() {
            let _ = writeln!(out, "hapi_unauthenticated_total{{code=\"{code}\"}} {n}");
        }
        let upload_families: [UploadFamily; 2] = [
            (
                "hapi_uploads_total",
                "Uploads taken to the compiler, by tenant and outcome code.",
                |u| u.0.to_string(),
            ),
            (
                "hapi_compile_seconds_total",
                "Time the host spent checking, compiling and preparing a tenant's uploads.",
                |u| u.1.to_string(),
            ),
        ];
        for (name, help, value) in upload_families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for ((tenant, code), u) in uploads.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{tenant=\"{}\",code=\"{code}\"}} {}",
                    escape(tenant),
                    value(u)
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(m: &Metrics, tenant: &str, function: &str, code: &str, read: u64) {
        seen_if(m, tenant, function, code, read, true);
    }

    fn seen_if(m: &Metrics, tenant: &str, function: &str, code: &str, read: u64, deployed: bool) {
        m.observe(
            Observation {
                tenant,
                function,
                code,
                total: Duration::from_millis(10),
                compute: Duration::ZERO,
                read_bytes: read,
                output_bytes: 1,
            },
            || deployed,
        );
    }

    #[test]
    fn a_removed_functions_series_fold_into_the_tenants_removed_series() {
        let m = Metrics::default();
        seen(&m, "a", "f", "ok", 5);
        seen(&m, "a", "f", "ok", 7);
        seen(&m, "a", "f", "client_closed", 1);
        seen(&m, "a", "f2", "ok", 100);
        seen(&m, "b", "f", "ok", 1000);
        m.fold("a", "f");
        seen(&m, "a", "g", "ok", 3);
        m.fold("a", "g");
        // An invocation of `h` that ended after `h` was removed (and its series folded).
        seen_if(&m, "a", "h", "ok", 4, false);
        let text = m.render();
        assert!(!text.contains("function=\"f\",code=\"ok\"} 2"), "{text}");
        for line in [
            "hapi_invocations_total{tenant=\"a\",function=\"(removed)\",code=\"ok\"} 4",
            "hapi_read_bytes_total{tenant=\"a\",function=\"(removed)\",code=\"ok\"} 19",
            "hapi_invocations_total{tenant=\"a\",function=\"(removed)\",code=\"client_closed\"} 1",
            "hapi_read_bytes_total{tenant=\"a\",function=\"f2\",code=\"ok\"} 100",
            "hapi_read_bytes_total{tenant=\"b\",function=\"f\",code=\"ok\"} 1000",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        assert!(
            !text.contains("tenant=\"a\",function=\"f\"")
                && !text.contains("function=\"g\"")
                && !text.contains("function=\"h\""),
            "{text}"
        );
    }
}
