//! Near the data: a host beside a SeaweedFS volume server reads the replicas that server holds
//! from it directly, instead of through the S3 gateway (which would fetch them from a volume
//! server, maybe this one, and send them on: the object crossing the node's link twice).
//!
//! The filer tells an object's chunks (`GET /buckets/<bucket>/<key>?metadata=true`: each chunk's
//! file id `volume,needle` and its place in the object); the volume server tells which volumes
//! it holds (`/status`, cached for a few seconds). A read whose chunks are all local is served
//! from the volume server with HTTP ranges; anything else (a chunk elsewhere, compressed or
//! encrypted chunks, content kept in the filer, any error or timeout) returns `None`, and the
//! caller reads through S3 as before. The tenant's grants and byte charges were checked before
//! any of this (the `scoped` layer), and no more than the bytes asked for are read into memory.

use crate::locks::lock;
use crate::policy::Locality as Settings;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the volume server's list of volumes is trusted.
const VOLUMES_FOR: Duration = Duration::from_secs(5);
/// Most keys one placement request may ask about.
pub const MAX_PLACEMENT_KEYS: usize = 1024;
/// Filer lookups in flight at once, host-wide, and the most of an entry's JSON read: what
/// lookups may hold in memory on no tenant's account is bounded by their product (8 MiB).
const LOOKUPS: usize = 32;
const MAX_ENTRY: usize = 256 << 10;
/// Filer lookups one tenant's placement requests may have in flight or queued for a host-wide
/// slot, however many requests it sends at once: another tenant's lookup waits behind at most
/// this many of each tenant's (the host-wide queue is first come, first served).
const TENANT_LOOKUPS: usize = 8;

/// One chunk of an object: `[offset, offset + size)` of it is needle `file_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chunk {
    file_id: String,
    volume: u32,
    offset: u64,
    size: u64,
}

#[derive(Debug)]
pub struct Locality {
    settings: Settings,
    http: reqwest::Client,
    volumes: Mutex<Option<(Instant, Arc<HashSet<u32>>)>>,
    /// Held by the one read that fetches `/status` again: the others use the list they have,
    /// or wait for that fetch when there is none yet, so the volume server gets one request per
    /// [`VOLUMES_FOR`] however many reads find the list expired (each was up to its 10 s and a
    /// 1 MiB body, on no tenant's account).
    refreshing: tokio::sync::Mutex<()>,
    lookups: tokio::sync::Semaphore,
    /// Each tenant's share of the lookups ([`TENANT_LOOKUPS`]), by tenant name.
    tenant_lookups: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
    local_reads: AtomicU64,
    gateway_reads: AtomicU64,
    /// Filer lookups made for each tenant's placement requests since start (by tenant name:
    /// the policy's tenants, those that asked).
    placed: Mutex<std::collections::BTreeMap<String, u64>>,
}

/// What a host knows of its placement (tenants get the volumes only, `GET /v1/placement`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub volume_server: String,
    pub volumes: Vec<u32>,
    /// Reads served from the local volume server, and through the gateway, since start.
    pub local_reads: u64,
    pub gateway_reads: u64,
}

/// `s` with every byte but unreserved ones and `/` percent-encoded (a key as a URL path).
fn encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The chunks of a filer entry (its JSON), in object order; `None` when they cannot be read
/// straight from a volume server (compressed, encrypted, content inline, a manifest chunk).
fn chunks(entry: &serde_json::Value) -> Option<Vec<Chunk>> {
    let list = entry.get("chunks")?.as_array()?;
    let mut out = Vec::with_capacity(list.len());
    for c in list {
        let plain = ["is_compressed", "cipher_key", "is_chunk_manifest"]
            .iter()
            .all(|k| {
                c.get(k)
                    .is_none_or(|v| v.is_null() || v == false || v == "")
            });
        if !plain {
            return None;
        }
        let file_id = c.get("file_id")?.as_str()?.to_string();
        let volume = file_id.split_once(',')?.0.parse().ok()?;
        out.push(Chunk {
            volume,
            offset: c
                .get("offset")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0),
            size: c.get("size")?.as_u64()?,
            file_id,
        });
    }
    out.sort_by_key(|c| c.offset);
    Some(out)
}

impl Locality {
    pub fn new(settings: Settings) -> Self {
        // A redirect is not followed: a volume server's answer is its own bytes, not those of
        // any address it names (inside the storage network, where the host runs).
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self {
            settings,
            http,
            volumes: Mutex::default(),
            refreshing: tokio::sync::Mutex::default(),
            lookups: tokio::sync::Semaphore::new(LOOKUPS),
            tenant_lookups: Mutex::default(),
            local_reads: AtomicU64::new(0),
            gateway_reads: AtomicU64::new(0),
            placed: Mutex::default(),
        }
    }

    /// The cached list of volumes, and whether it is still to be trusted.
    fn cached_volumes(&self) -> Option<(bool, Arc<HashSet<u32>>)> {
        let cached = lock(&self.volumes);
        cached
            .as_ref()
            .map(|(at, set)| (at.elapsed() < VOLUMES_FOR, Arc::clone(set)))
    }

    /// The volumes the local volume server holds (cached; empty when it does not answer).
    /// One read at a time fetches them again (see `refreshing`).
    async fn volumes(&self) -> Arc<HashSet<u32>> {
        let stale = match self.cached_volumes() {
            Some((true, set)) => return set,
            Some((false, set)) => Some(set),
            None => None,
        };
        let _refreshing = match (self.refreshing.try_lock(), stale) {
            (Ok(guard), _) => guard,
            (Err(_), Some(stale)) => return stale,
            (Err(_), None) => self.refreshing.lock().await,
        };
        // Fetched by the read that held the lock before this one.
        if let Some((true, set)) = self.cached_volumes() {
            return set;
        }
        let url = format!("{}/status", self.settings.volume_server);
        let set: HashSet<u32> = match self.get_json(&url, 1 << 20).await {
            Some(v) => v["Volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["Id"].as_u64().and_then(|id| u32::try_from(id).ok()))
                .collect(),
            None => HashSet::new(),
        };
        let set = Arc::new(set);
        *lock(&self.volumes) = Some((Instant::now(), Arc::clone(&set)));
        set
    }

    /// GETs `url` and parses at most `limit` bytes of JSON; `None` on any failure.
    async fn get_json(&self, url: &str, limit: usize) -> Option<serde_json::Value> {
        let resp = self.http.get(url).send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let mut body = Vec::new();
        read_capped(resp, limit, &mut body).await?;
        serde_json::from_slice(&body).ok()
    }

    /// The object's chunks, from the filer.
    /// A read does not wait for a lookup slot (`wait` false): with every slot taken (by
    /// placement requests, say), it goes through the gateway at once, so no tenant's lookups
    /// hold up another's reads.
    async fn object_chunks(&self, bucket: &str, key: &str, wait: bool) -> Option<Vec<Chunk>> {
        let url = format!(
            "{}/buckets/{}/{}?metadata=true",
            self.settings.filer,
            encode_path(bucket),
            encode_path(key)
        );
        let _slot = if wait {
            self.lookups.acquire().await.ok()?
        } else {
            self.lookups.try_acquire().ok()?
        };
        chunks(&self.get_json(&url, MAX_ENTRY).await?)
    }

    /// Bytes `[offset, offset + length)` of the object from the local volume server, when
    /// every chunk they span is there; `None` means: read it through the gateway. Its chunk
    /// lookup takes one of `tenant`'s [`TENANT_LOOKUPS`] and a host-wide slot, or none (to the
    /// gateway at once): one tenant's reads cannot take every slot and send every other
    /// tenant's reads through the gateway.
    pub async fn read(
        &self,
        tenant: &str,
        bucket: &str,
        key: &str,
        offset: u64,
        length: u64,
    ) -> Option<Vec<u8>> {
        let served = self.read_local(tenant, bucket, key, offset, length).await;
        let counter = if served.is_some() {
            &self.local_reads
        } else {
            &self.gateway_reads
        };
        counter.fetch_add(1, Ordering::Relaxed);
        served
    }

    async fn read_local(
        &self,
        tenant: &str,
        bucket: &str,
        key: &str,
        offset: u64,
        length: u64,
    ) -> Option<Vec<u8>> {
        let end = offset.checked_add(length)?;
        // The tenant's lookup is held for the filer's answer only, not the transfer.
        let chunks = {
            let share = self.tenant_share(tenant);
            let _mine = share.try_acquire().ok()?;
            self.object_chunks(bucket, key, false).await?
        };
        let local = self.volumes().await;
        let wanted: Vec<&Chunk> = chunks
            .iter()
            .filter(|c| c.offset < end && c.offset.saturating_add(c.size) > offset)
            .collect();
        if wanted.is_empty() || wanted.iter().any(|c| !local.contains(&c.volume)) {
            return None;
        }
        // The chunks must cover the range without gaps (a sparse object reads as zeros
        // through the gateway; leave that to it) and without overlaps: a chunk written over
        // part of another wins by its time, which the gateway resolves; read in offset order,
        // the older bytes were served, and a chunk inside the part already read made `to -
        // from` underflow (a panic, or in a release build a range and a cap of about 2^64).
        let mut out = Vec::with_capacity(usize::try_from(length).ok()?);
        let mut at = offset;
        for (i, c) in wanted.into_iter().enumerate() {
            if c.offset > at || (i > 0 && c.offset < at) {
                return None;
            }
            let from = at - c.offset;
            let to = (end - c.offset).min(c.size);
            let url = format!("{}/{}", self.settings.volume_server, c.file_id);
            let resp = self
                .http
                .get(&url)
                .header("Range", format!("bytes={from}-{}", to - 1))
                .send()
                .await
                .ok()?;
            let n = usize::try_from(to - from).ok()?;
            let ranged = resp.status() == reqwest::StatusCode::PARTIAL_CONTENT;
            let whole = resp.status() == reqwest::StatusCode::OK && from == 0 && to == c.size;
            if !(ranged || whole) {
                return None;
            }
            // Straight into the read's buffer (sized for it: no copy of a chunk beside it).
            if read_capped(resp, n, &mut out).await? != n {
                return None;
            }
            at = c.offset + to;
        }
        (at >= end || out.len() as u64 == length).then_some(out)
    }

    /// Each key's volumes (empty where the filer does not know it or its chunks cannot be
    /// read from a volume server), for `tenant`: its lookups take one of its
    /// [`TENANT_LOOKUPS`] first, then a host-wide slot. A key named more than once is looked
    /// up once (a request naming its largest object 1,024 times had the filer send, and the
    /// host parse, up to 256 KiB of chunk list 1,024 times).
    /// Keys whose lookups have not ended by `deadline` are answered with no volumes (placement
    /// is advice: the caller reads those through any host).
    pub async fn placement(
        &self,
        tenant: &str,
        bucket: &str,
        keys: &[String],
        deadline: &crate::account::Deadline,
    ) -> Vec<Vec<u32>> {
        use futures::StreamExt;
        let mut unique: Vec<&str> = Vec::new();
        let mut first: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let at: Vec<usize> = keys
            .iter()
            .map(|k| {
                *first.entry(k.as_str()).or_insert_with(|| {
                    unique.push(k);
                    unique.len() - 1
                })
            })
            .collect();
        let share = self.tenant_share(tenant);
        let looked_up: Vec<Vec<u32>> =
            futures::stream::iter(unique.into_iter().map(str::to_string))
                .map(|key: String| {
                    let share = Arc::clone(&share);
                    async move {
                        let Ok(_mine) = share.acquire().await else {
                            return Vec::new();
                        };
                        *lock(&self.placed).entry(tenant.to_string()).or_default() += 1;
                        let mut v: Vec<u32> = self
                            .object_chunks(bucket, &key, true)
                            .await
                            .unwrap_or_default()
                            .iter()
                            .map(|c| c.volume)
                            .collect();
                        v.sort_unstable();
                        v.dedup();
                        v
                    }
                })
                .buffered(TENANT_LOOKUPS)
                .take_until(tokio::time::sleep_until(deadline.at().into()))
                .collect()
                .await;
        at.into_iter()
            .map(|i| looked_up.get(i).cloned().unwrap_or_default())
            .collect()
    }

    /// `tenant`'s lookup semaphore (made on first use; those of tenants with nothing in flight
    /// are dropped then, so the map holds only the tenants placing keys now).
    fn tenant_share(&self, tenant: &str) -> Arc<tokio::sync::Semaphore> {
        let mut map = lock(&self.tenant_lookups);
        map.retain(|name, s| name == tenant || Arc::strong_count(s) > 1);
        Arc::clone(
            map.entry(tenant.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(TENANT_LOOKUPS))),
        )
    }

    /// Reads served from the local volume server and through the gateway since start.
    pub fn reads(&self) -> (u64, u64) {
        (
            self.local_reads.load(Ordering::Relaxed),
            self.gateway_reads.load(Ordering::Relaxed),
        )
    }

    /// `hapi_locality_reads_total` and `hapi_placement_lookups_total` in the Prometheus text
    /// format.
    pub fn render_metrics(&self, out: &mut String) {
        let (local, gateway) = self.reads();
        out.push_str(&format!(
            "# HELP hapi_locality_reads_total Object reads by where they were served from: the local volume server, or the S3 gateway (not local, or a lookup failed).\n# TYPE hapi_locality_reads_total counter\nhapi_locality_reads_total{{from=\"local\"}} {local}\nhapi_locality_reads_total{{from=\"gateway\"}} {gateway}\n"
        ));
        // The filer serves every host and the S3 gateway: who asks it how much is the
        // operator's to see (a tenant's placement requests reach it 1,024 keys at a time).
        out.push_str("# HELP hapi_placement_lookups_total Filer lookups made for a tenant's placement requests.\n# TYPE hapi_placement_lookups_total counter\n");
        for (tenant, n) in lock(&self.placed).iter() {
            out.push_str(&format!(
                "hapi_placement_lookups_total{{tenant=\"{tenant}\"}} {n}\n"
            ));
        }
    }

    pub async fn report(&self) -> Report {
        let mut volumes: Vec<u32> = self.volumes().await.iter().copied().collect();
        volumes.sort_unstable();
        let (local_reads, gateway_reads) = self.reads();
        Report {
            volume_server: self.settings.volume_server.clone(),
            volumes,
            local_reads,
            gateway_reads,
        }
    }
}

/// Appends the response's body to `out` and gives its length, or `None` if it is longer than
/// `limit` or fails (what was appended by then is the caller's to drop).
async fn read_capped(
    mut resp: reqwest::Response,
    limit: usize,
    out: &mut Vec<u8>,
) -> Option<usize> {
    let start = out.len();
    while let Some(chunk) = resp.chunk().await.ok()? {
        if out.len() - start + chunk.len() > limit {
            return None;
        }
        out.extend_from_slice(&chunk);
    }
    Some(out.len() - start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::Deadline;

    #[test]
    fn a_filer_entry_gives_its_chunks_in_order_and_refuses_what_a_volume_server_cannot_serve() {
        let entry = serde_json::json!({"chunks": [
            {"file_id": "7,02aa", "offset": 100, "size": 50},
            {"file_id": "6,0113aae9a7", "size": 100},
        ]});
        let c = chunks(&entry).expect("plain chunks");
        assert_eq!(
            c.iter()
                .map(|c| (c.volume, c.offset, c.size))
                .collect::<Vec<_>>(),
            vec![(6, 0, 100), (7, 100, 50)]
        );
        for refused in [
            serde_json::json!({"chunks": [{"file_id": "6,01", "size": 5, "is_compressed": true}]}),
            serde_json::json!({"chunks": [{"file_id": "6,01", "size": 5, "cipher_key": "a2V5"}]}),
            serde_json::json!({"chunks": [{"file_id": "no-comma", "size": 5}]}),
            serde_json::json!({"Content": "aGk="}),
        ] {
            assert_eq!(chunks(&refused), None, "{refused}");
        }
    }

    #[test]
    fn keys_are_percent_encoded_as_url_paths() {
        assert_eq!(
            encode_path("a b/c?d#e%/ü.png"),
            "a%20b/c%3Fd%23e%25/%C3%BC.png"
        );
    }

    /// An HTTP server on a socket, one thread per connection: `answer` gets each request's
    /// head and gives the JSON body to answer with (`None`: hold the request unanswered for
    /// 30 s).
    fn test_server(
        answer: impl Fn(&[u8]) -> Option<&'static str> + Send + Sync + 'static,
    ) -> String {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let answer = Arc::new(answer);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let answer = Arc::clone(&answer);
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let Some(body) = answer(&got) else {
                        std::thread::sleep(Duration::from_secs(30));
                        return;
                    };
                    // An answer that starts with a status line is sent as it is.
                    let _ = if body.starts_with("HTTP/1.1 ") {
                        conn.write_all(body.as_bytes())
                    } else {
                        write!(
                            conn,
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    };
                });
            }
        });
        format!("http://{addr}")
    }

    /// Overlapping chunks (a later write over part of an object) are left to the gateway, which
    /// knows which bytes are current: read in offset order, the older chunk's bytes were
    /// served, and a chunk inside the part already read underflowed (a panic here).
    #[tokio::test]
    async fn overlapping_chunks_are_read_through_the_gateway() {
        // A filer that gives key `k` the chunks `chunks`, and a volume server with volume 3
        // that answers each chunk whole (10 bytes of JSON text).
        let near = |chunks: &'static str| {
            let filer =
                test_server(move |head| head.starts_with(b"GET /buckets/b/k?").then_some(chunks));
            let volume_server = test_server(|head| {
                Some(if head.starts_with(b"GET /status") {
                    r#"{"Volumes":[{"Id":3}]}"#
                } else {
                    r#""12345678""#
                })
            });
            Locality::new(Settings {
                filer,
                volume_server,
            })
        };
        for chunks in [
            // The second inside the first.
            r#"{"chunks":[{"file_id":"3,01","size":10},{"file_id":"3,02","offset":2,"size":2}]}"#,
            // The second over the first's end.
            r#"{"chunks":[{"file_id":"3,01","size":10},{"file_id":"3,02","offset":5,"size":5}]}"#,
            // Both at the start.
            r#"{"chunks":[{"file_id":"3,01","size":10},{"file_id":"3,02","size":10}]}"#,
        ] {
            assert_eq!(
                near(chunks).read("a", "b", "k", 0, 10).await,
                None,
                "{chunks}"
            );
        }
        // Chunks end to end are read from the volume server.
        let end_to_end =
            r#"{"chunks":[{"file_id":"3,01","size":10},{"file_id":"3,02","offset":10,"size":10}]}"#;
        assert_eq!(
            near(end_to_end).read("a", "b", "k", 0, 20).await.as_deref(),
            Some(&b"\"12345678\"\"12345678\""[..])
        );
    }

    /// A volume server's redirect is not followed: the bytes at the address it names were
    /// served as the object's.
    #[tokio::test]
    async fn a_volume_servers_redirect_is_not_followed() {
        let elsewhere = test_server(|_| Some(r#""12345678""#));
        let moved: &'static str = Box::leak(
            format!(
                "HTTP/1.1 302 Found\r\nlocation: {elsewhere}/x\r\ncontent-length: 0\r\n\
                 connection: close\r\n\r\n"
            )
            .into_boxed_str(),
        );
        let near = Locality::new(Settings {
            filer: test_server(|head| {
                head.starts_with(b"GET /buckets/b/k?")
                    .then_some(r#"{"chunks":[{"file_id":"3,01","size":10}]}"#)
            }),
            volume_server: test_server(move |head| {
                Some(if head.starts_with(b"GET /status") {
                    r#"{"Volumes":[{"Id":3}]}"#
                } else {
                    moved
                })
            }),
        });
        assert_eq!(near.read("a", "b", "k", 0, 10).await, None);
    }

    /// A filer that answers `GET /buckets/b/fast` with one chunk on volume 3 and holds every
    /// other request unanswered (for 30 s); the count of `fast`'s lookups.
    fn stalling_filer() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let fast = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&fast);
        let url = test_server(move |head| {
            head.starts_with(b"GET /buckets/b/fast?").then(|| {
                counted.fetch_add(1, Ordering::Relaxed);
                r#"{"chunks":[{"file_id":"3,01aa","size":5}]}"#
            })
        });
        (url, fast)
    }

    /// A placement answers at its deadline with what it found: keys whose lookups the filer
    /// still holds have no volumes (it waited for every lookup, up to the client's 10 s each,
    /// eight at a time: 80 s for these 64 keys).
    #[tokio::test]
    async fn a_placement_answers_what_it_found_by_its_deadline() {
        let (filer, _) = stalling_filer();
        let near = Locality::new(Settings {
            filer,
            volume_server: "http://127.0.0.1:9".into(),
        });
        let mut keys = vec!["fast".to_string()];
        keys.extend((0..64).map(|k| format!("slow/{k}")));
        let deadline = Deadline::new(Duration::from_secs(1));
        let found = tokio::time::timeout(
            Duration::from_secs(30),
            near.placement("a", "b", &keys, &deadline),
        )
        .await
        .expect("answered at its deadline, not once every lookup had ended");
        assert_eq!(found[0], vec![3]);
        assert!(found[1..].iter().all(Vec::is_empty));
        assert_eq!(found.len(), keys.len());
    }

    #[tokio::test]
    async fn a_key_named_again_is_looked_up_once() {
        let (filer, fast) = stalling_filer();
        let near = Locality::new(Settings {
            filer,
            volume_server: "http://127.0.0.1:9".into(),
        });
        let keys = vec!["fast".to_string(); 100];
        assert_eq!(
            near.placement("a", "b", &keys, &Deadline::new(Duration::from_secs(60)))
                .await,
            vec![vec![3]; 100]
        );
        assert_eq!(fast.load(Ordering::Relaxed), 1);
    }

    /// Waits (5 s at most) for the flooding tenant's lookups to take the host-wide slots its
    /// share allows, and asserts, a moment later, that they took no more (`what` says whose).
    async fn holds_its_share(near: &Locality, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while near.lookups.available_permits() > LOOKUPS - TENANT_LOOKUPS
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            near.lookups.available_permits(),
            LOOKUPS - TENANT_LOOKUPS,
            "{what}, no more"
        );
    }

    /// Reads take their chunk lookups from their tenant's share too: tenant a's 40 reads of
    /// objects whose lookups the filer holds take 8 of the host-wide slots, and tenant c's
    /// read still looks its object up (it had found every slot taken and gone to the gateway
    /// without looking: locality lost for every tenant but the flooding one).
    #[tokio::test]
    async fn a_tenant_flooding_reads_leaves_lookups_for_the_others() {
        let (filer, fast) = stalling_filer();
        let near = Arc::new(Locality::new(Settings {
            filer,
            volume_server: "http://127.0.0.1:9".into(),
        }));
        let flood: Vec<_> = (0..40)
            .map(|i| {
                let near = Arc::clone(&near);
                tokio::spawn(async move { near.read("a", "b", &format!("slow/{i}"), 0, 5).await })
            })
            .collect();
        holds_its_share(
            &near,
            "tenant a's reads hold its share of the host-wide lookups",
        )
        .await;
        // Looked up (the volume server is not there: the read then goes to the gateway).
        assert_eq!(near.read("c", "b", "fast", 0, 5).await, None);
        assert_eq!(fast.load(Ordering::Relaxed), 1, "tenant c's read looked up");
        for t in flood {
            t.abort();
        }
    }

    #[tokio::test]
    async fn a_tenant_flooding_placement_requests_leaves_lookups_for_the_others() {
        let near = Arc::new(Locality::new(Settings {
            filer: stalling_filer().0,
            volume_server: "http://127.0.0.1:9".into(),
        }));
        // Tenant a: 8 requests of 64 keys at once, against a filer that holds them unanswered.
        // Without a share per tenant they would take all 32 host-wide slots (for the client's
        // 10 s timeout) and queue 500 more lookups ahead of anyone else's.
        let flood: Vec<_> = (0..8)
            .map(|i| {
                let near = Arc::clone(&near);
                let keys: Vec<String> = (0..64).map(|k| format!("slow/{i}/{k}")).collect();
                tokio::spawn(async move {
                    near.placement("a", "b", &keys, &Deadline::new(Duration::from_secs(60)))
                        .await
                })
            })
            .collect();
        holds_its_share(&near, "tenant a holds its share of the host-wide lookups").await;
        let other = tokio::time::timeout(
            Duration::from_secs(5),
            near.placement(
                "c",
                "b",
                &["fast".to_string()],
                &Deadline::new(Duration::from_secs(60)),
            ),
        )
        .await
        .expect("tenant c's lookup waited behind tenant a's");
        assert_eq!(other, vec![vec![3]]);
        assert!(
            flood.iter().all(|t| !t.is_finished()),
            "tenant a's lookups are still held by the filer"
        );
        for t in flood {
            t.abort();
        }
    }

    /// A volume server that answers `/status` (volume 3) after 300 ms; the count of `/status`
    /// requests it received.
    fn slow_volume_server() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&asked);
        let url = test_server(move |head| {
            if head.starts_with(b"GET /status ") {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(300));
            Some(r#"{"Volumes":[{"Id":3}]}"#)
        });
        (url, asked)
    }

    /// Reads that find the list of volumes missing or expired ask the volume server once
    /// between them: the first waits for it, later ones use the expired list meanwhile.
    #[tokio::test]
    async fn the_volume_list_is_fetched_once_however_many_reads_need_it() {
        let (volume_server, asked) = slow_volume_server();
        let near = Arc::new(Locality::new(Settings {
            filer: "http://127.0.0.1:9".into(),
            volume_server,
        }));
        let all_read = |near: &Arc<Locality>| {
            let reads: Vec<_> = (0..32)
                .map(|_| {
                    let near = Arc::clone(near);
                    tokio::spawn(async move { near.volumes().await })
                })
                .collect();
            async move {
                for r in reads {
                    assert_eq!(*r.await.expect("join"), HashSet::from([3]));
                }
            }
        };
        all_read(&near).await;
        assert_eq!(
            asked.load(Ordering::Relaxed),
            1,
            "32 reads with no list yet"
        );
        // Expired: one read fetches it again.
        {
            let mut cached = near.volumes.lock().expect("lock");
            let (at, _) = cached.as_mut().expect("cached");
            *at = Instant::now()
                .checked_sub(VOLUMES_FOR + Duration::from_secs(1))
                .expect("an instant in the past");
        }
        all_read(&near).await;
        assert!(near.cached_volumes().is_some_and(|(fresh, _)| fresh));
        assert_eq!(
            asked.load(Ordering::Relaxed),
            2,
            "32 reads of an expired list"
        );
    }
}
