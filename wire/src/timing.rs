//! Where an invocation's time went, as the host reports it in a `Server-Timing` header
//! (`instantiate;dur=0.120, read;dur=1.500, ...`, milliseconds).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The stages of one invocation, in the order they happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// A fresh instance of the function.
    Instantiate,
    /// Object reads.
    Read,
    /// Guest time outside host calls: decoding and preprocessing, mostly.
    Decode,
    /// Waiting for the host: for the device (memory, batch mates, other tenants' turns) and for
    /// a model's first load.
    Queue,
    /// Model segments on the device.
    Compute,
    /// Encoding the response.
    Encode,
    /// The whole request, from its arrival to its encoded response.
    Total,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::Instantiate,
        Stage::Read,
        Stage::Decode,
        Stage::Queue,
        Stage::Compute,
        Stage::Encode,
        Stage::Total,
    ];

    /// The stage's name in the header.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Instantiate => "instantiate",
            Stage::Read => "read",
            Stage::Decode => "decode",
            Stage::Queue => "queue",
            Stage::Compute => "compute",
            Stage::Encode => "encode",
            Stage::Total => "total",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// Seconds per stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerTiming {
    pub instantiate: f64,
    pub read: f64,
    pub decode: f64,
    pub queue: f64,
    pub compute: f64,
    pub encode: f64,
    pub total: f64,
}

impl ServerTiming {
    pub fn get(&self, stage: Stage) -> f64 {
        match stage {
            Stage::Instantiate => self.instantiate,
            Stage::Read => self.read,
            Stage::Decode => self.decode,
            Stage::Queue => self.queue,
            Stage::Compute => self.compute,
            Stage::Encode => self.encode,
            Stage::Total => self.total,
        }
    }

    pub fn set(&mut self, stage: Stage, d: Duration) {
        let v = d.as_secs_f64();
        match stage {
            Stage::Instantiate => self.instantiate = v,
            Stage::Read => self.read = v,
            Stage::Decode => self.decode = v,
            Stage::Queue => self.queue = v,
            Stage::Compute => self.compute = v,
            Stage::Encode => self.encode = v,
            Stage::Total => self.total = v,
        }
    }

    /// The header value.
    pub fn header(&self) -> String {
        Stage::ALL
            .iter()
            .map(|&s| format!("{};dur={:.3}", s.name(), self.get(s) * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Parses a header value; unknown stages and malformed parts are skipped.
    pub fn parse(header: &str) -> Self {
        let mut t = Self::default();
        for part in header.split(',') {
            let mut it = part.trim().split(';');
            let Some(stage) = it.next().and_then(|n| Stage::from_name(n.trim())) else {
                continue;
            };
            let ms = it
                .find_map(|kv| kv.trim().strip_prefix("dur="))
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0);
            if let Some(ms) = ms {
                t.set(stage, Duration::from_secs_f64(ms / 1e3));
            }
        }
        t
    }

    pub fn add(&mut self, o: &Self) {
        for s in Stage::ALL {
            let sum = self.get(s) + o.get(s);
            self.set(s, Duration::from_secs_f64(sum));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_round_trips_in_seconds() {
        let t = ServerTiming::parse(
            "instantiate;dur=0.100, read;dur=1.5, decode;dur=20.000, queue;dur=3, compute;dur=57.25, encode;dur=0.4, total;dur=80.000, other;dur=9",
        );
        assert!((t.read - 0.0015).abs() < 1e-12);
        assert!((t.decode - 0.02).abs() < 1e-12);
        assert!((t.queue - 0.003).abs() < 1e-12);
        assert!((t.compute - 0.05725).abs() < 1e-12);
        assert!((t.total - 0.08).abs() < 1e-12);
        let again = ServerTiming::parse(&t.header());
        for s in Stage::ALL {
            assert!((again.get(s) - t.get(s)).abs() < 1e-6, "{s:?}");
        }
        assert_eq!(
            ServerTiming::parse("read;dur=-4, total;dur=NaN, ;;;"),
            ServerTiming::default()
        );
    }
}
