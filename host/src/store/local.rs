//! The local store: a directory whose subdirectories are buckets, reached only through a
//! cap-std handle opened once (cap-std refuses `..`, absolute paths and symlinks that escape).
//!
//! A key names a regular file reached through directories, as an object store's key names an
//! object: below its bucket the store follows no symbolic link (a link `public/x` to
//! `../private/y` would let a tenant granted `public/` read `private/`, a prefix it was not
//! granted; cap-std only keeps a link from leaving the bucket), and opens nothing that is not a
//! regular file (opening a FIFO would block its thread until a writer came, and no look at its
//! caller could stop it). A listing shows neither, and a walk enters no linked directory.
//!
//! File system calls block, so each runs on tokio's blocking pool, and stops at its next look
//! (every MiB read, every directory entry) once its caller has gone away: an invocation
//! stopped at its deadline, or abandoned by its client, leaves no reads or walks running for
//! nobody (a blocking job cannot be aborted, and a walk of a large prefix runs for seconds).
//! The job's work is its caller's: at those looks, once per epoch tick, it lets the caller's
//! [`Pace`] decide whether it goes on now (an invocation's tenant within its share of the
//! workers) or waits its turn, off the thread (the job's state is kept, and its next step runs
//! on a blocking thread once the turn comes); a blocking thread is otherwise CPU beside every
//! tenant's share.
//! Errors that say the key cannot exist here (a name too long for the file system, a key below
//! an object) are `NotFound`; an escape is `Denied`; only real I/O failures are `Io`.

use super::error::{Held, ObjectError, ObjectMeta, Smallest, string_bytes};
use crate::account::text::quote;
use crate::account::{Account, Cancel, Pace, Paced};
use crate::wasm::engine::EPOCH_TICK;
use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, File, OpenOptions};
use hapi_wire::invoke::MAX_KEY_BYTES;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, UNIX_EPOCH};

/// Bytes a read takes between two looks at whether its caller is still there.
const READ_CHUNK: u64 = 1 << 20;

#[derive(Debug)]
pub struct Local {
    root: Arc<Dir>,
}

/// Maps an I/O error on `key` to what it means for the caller.
fn map(key: &str, e: std::io::Error) -> ObjectError {
    match e.kind() {
        ErrorKind::NotFound
        | ErrorKind::NotADirectory
        | ErrorKind::IsADirectory
        | ErrorKind::InvalidFilename
        | ErrorKind::InvalidInput => ObjectError::NotFound(quote(key)),
        ErrorKind::PermissionDenied => ObjectError::Denied(quote(key)),
        // A symbolic link where the key goes (the store follows none), or a loop of them.
        _ if e.raw_os_error() == Some(libc::ELOOP) => ObjectError::Denied(format!(
            "`{}` goes through a symbolic link (the local store follows none)",
            quote(key)
        )),
        _ => ObjectError::Io(format!("{}: {e}", quote(key))),
    }
}

fn modified_ms(meta: &cap_std::fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.into_std().duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a blocking job looks at between its steps: whether its caller is still there, and,
/// once per epoch tick, the caller's pace.
struct Steps {
    cancel: Cancel,
    pace: Option<Arc<dyn Pace>>,
    next_pace: Instant,
}

/// Why a job's step ends before its work does.
enum Halt {
    /// The job ends with this error.
    Stop(ObjectError),
    /// The caller must wait for its turn: the job gives its thread back, and its next step,
    /// once the caller has its turn, goes on where this one ended. It names the key.
    Wait(String),
}

impl From<ObjectError> for Halt {
    fn from(e: ObjectError) -> Self {
        Self::Stop(e)
    }
}

/// A job's end: its stop once its caller has gone, or its caller's time is up.
fn stopped(key: &str, why: &str) -> ObjectError {
    ObjectError::Stopped(format!("{}: {why}", quote(key)))
}

impl Steps {
    /// Whether the job goes on: not once its caller is gone, nor, at its pace (the first
    /// step, then once per tick), once the caller's time is up ([`Halt::Stop`]), and not on
    /// this thread while the caller must wait for its turn ([`Halt::Wait`]).
    fn go_on(&mut self, key: &str) -> Result<(), Halt> {
        if self.cancel.is_cancelled() {
            return Err(stopped(key, "its caller went away").into());
        }
        if let Some(pace) = &self.pace
            && Instant::now() >= self.next_pace
        {
            match pace.try_pace() {
                Some(true) => self.next_pace = Instant::now() + EPOCH_TICK,
                Some(false) => return Err(stopped(key, "its caller's time is up").into()),
                None => return Err(Halt::Wait(key.to_string())),
            }
        }
        Ok(())
    }
}

/// Runs blocking file system work off the async threads, paced by `pace`: `f` looks at what
/// it is given between steps, and stops once the caller has gone. While the caller waits for
/// its turn, the job holds no thread: `f` returns [`Halt::Wait`], and is called again, on a
/// blocking thread, once the caller has its turn, with the state it keeps.
async fn blocking<T: Send + 'static, F>(pace: Paced<'_>, f: F) -> Result<T, ObjectError>
where
    F: FnMut(&mut Steps) -> Result<T, Halt> + Send + 'static,
{
    let cancel = Cancel::default();
    let _cancel = cancel.on_drop();
    let mut job = (
        f,
        Steps {
            cancel,
            pace: pace.map(Arc::clone),
            // The first step paces: a job that starts past its caller's time does nothing.
            next_pace: Instant::now(),
        },
    );
    loop {
        let (back, out) = tokio::task::spawn_blocking(move || {
            let (f, steps) = &mut job;
            let out = f(steps);
            (job, out)
        })
        .await
        .map_err(|e| ObjectError::Io(format!("store worker: {e}")))?;
        job = back;
        match out {
            Ok(done) => return Ok(done),
            Err(Halt::Stop(e)) => return Err(e),
            Err(Halt::Wait(key)) => {
                let steps = &mut job.1;
                // Only a pace asks to wait.
                let go = match &steps.pace {
                    Some(pace) => pace.turn().await,
                    None => true,
                };
                if !go {
                    return Err(stopped(&key, "its caller's time is up"));
                }
                steps.next_pace = Instant::now() + EPOCH_TICK;
            }
        }
    }
}

impl Local {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: Arc::new(Dir::open_ambient_dir(path, ambient_authority())?),
        })
    }

    /// The directory `path` names below `bucket` (`""`: the bucket), opened a segment at a
    /// time, each refused if it is a symbolic link.
    fn directory(bucket: &Dir, path: &str) -> std::io::Result<Option<Dir>> {
        let mut dir: Option<Dir> = None;
        for segment in path.split('/').filter(|s| !s.is_empty()) {
            let parent = dir.as_ref().unwrap_or(bucket);
            let next = parent.open_dir_nofollow(segment).map_err(|e| {
                // A link is refused as "not a directory"; say what it is.
                match parent.symlink_metadata(segment) {
                    Ok(m) if m.file_type().is_symlink() => {
                        std::io::Error::from_raw_os_error(libc::ELOOP)
                    }
                    _ => e,
                }
            })?;
            dir = Some(next);
        }
        Ok(dir)
    }

    /// The regular file `key` names below `bucket`, through no symbolic link; opened without
    /// blocking, so that a FIFO is refused rather than waited on.
    fn object(bucket: &Dir, key: &str) -> Result<File, ObjectError> {
        let (path, name) = key.rsplit_once('/').unwrap_or(("", key));
        let dir = Self::directory(bucket, path).map_err(|e| map(key, e))?;
        let file = dir
            .as_ref()
            .unwrap_or(bucket)
            .open_with(
                name,
                OpenOptions::new()
                    .read(true)
                    .follow(FollowSymlinks::No)
                    .nonblock(true),
            )
            .map_err(|e| map(key, e))?;
        if !file.metadata().map_err(|e| map(key, e))?.is_file() {
            return Err(ObjectError::NotFound(format!(
                "`{}` (not a regular file)",
                quote(key)
            )));
        }
        Ok(file)
    }

    fn bucket(root: &Dir, name: &str) -> Result<Dir, ObjectError> {
        root.open_dir(name).map_err(|e| match e.kind() {
            ErrorKind::NotFound | ErrorKind::NotADirectory => {
                ObjectError::NotFound(format!("bucket `{}`", quote(name)))
            }
            _ => map(name, e),
        })
    }

    pub async fn head(
        &self,
        bucket: &str,
        key: &str,
        pace: Paced<'_>,
    ) -> Result<ObjectMeta, ObjectError> {
        let (root, bucket, key) = (Arc::clone(&self.root), bucket.to_string(), key.to_string());
        blocking(pace, move |_| {
            let meta = Self::object(&Self::bucket(&root, &bucket)?, &key)?
                .metadata()
                .map_err(|e| map(&key, e))?;
            Ok(ObjectMeta {
                size: meta.len(),
                last_modified_ms: modified_ms(&meta),
                etag: None,
                key: key.clone(),
            })
        })
        .await
    }

    pub async fn read(
        &self,
        bucket: &str,
        key: &str,
        offset: u64,
        length: u64,
        pace: Paced<'_>,
    ) -> Result<Vec<u8>, ObjectError> {
        let (root, bucket, key) = (Arc::clone(&self.root), bucket.to_string(), key.to_string());
        // The file, what is left of the read, and the bytes read so far, kept between steps.
        let mut reading: Option<(std::io::Take<File>, Vec<u8>)> = None;
        blocking(pace, move |steps| {
            let (rest, buf) = match &mut reading {
                Some(going) => going,
                None => {
                    let mut file = Self::object(&Self::bucket(&root, &bucket)?, &key)?;
                    if offset > 0 {
                        file.seek(SeekFrom::Start(offset))
                            .map_err(|e| map(&key, e))?;
                    }
                    // What was charged and no more, even if the file grew meanwhile.
                    let buf = Vec::with_capacity(usize::try_from(length).unwrap_or(0));
                    reading.insert((file.take(length), buf))
                }
            };
            loop {
                steps.go_on(&key)?;
                let got = rest
                    .by_ref()
                    .take(READ_CHUNK)
                    .read_to_end(buf)
                    .map_err(|e| map(&key, e))?;
                if got == 0 {
                    return Ok(std::mem::take(buf));
                }
            }
        })
        .await
    }

    pub async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        limit: usize,
        max_visits: usize,
        keep: Arc<dyn Fn(&str) -> bool + Send + Sync>,
        (pace, account): (Paced<'_>, Option<&Arc<Account>>),
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        let (root, bucket, prefix) = (
            Arc::clone(&self.root),
            bucket.to_string(),
            prefix.to_string(),
        );
        let account = account.map(Arc::clone);
        // Walk from the deepest directory the prefix names. The directories still to walk are
        // kept as paths and opened in turn (a segment at a time, through no link), so that a
        // walk holds a few descriptors (the bucket's, one directory's and the next segment's)
        // however many subdirectories it finds: a thousand class directories, held open at
        // once by a few listings, would take every tenant's descriptors. One that cannot exist
        // here (or is gone by the time the walk comes to it) holds nothing.
        let (start, _) = prefix.rsplit_once('/').unwrap_or(("", &prefix));
        let mut walk = Walk {
            bucket: None,
            current: None,
            stack: vec![start.to_string()],
            // The directories still to walk are the caller's too: a wide tree of long names
            // held hundreds of MiB of paths at once, charged to nobody.
            to_walk: Held::new(account.as_ref(), "a listing's directories to walk"),
            kept: Smallest::new(limit, account.as_ref()),
            visits: 0,
        };
        blocking(pace, move |steps| {
            let dir = match &walk.bucket {
                Some(dir) => dir,
                None => walk.bucket.insert(Self::bucket(&root, &bucket)?),
            };
            loop {
                let (path, entries) = match &mut walk.current {
                    Some(current) => current,
                    None => {
                        let Some(path) = walk.stack.pop() else {
                            break;
                        };
                        walk.to_walk.shrink(string_bytes(&path));
                        let opened = match Self::directory(dir, &path) {
                            Ok(d) => d,
                            Err(e) => match map(&path, e) {
                                ObjectError::NotFound(_) => continue,
                                other => return Err(other.into()),
                            },
                        };
                        let entries = opened
                            .as_ref()
                            .unwrap_or(dir)
                            .entries()
                            .map_err(|e| map(&path, e))?;
                        walk.current.insert((path, entries))
                    }
                };
                // A step looks before it takes an entry: one that waits for its turn goes on
                // from the same entry.
                loop {
                    steps.go_on(&prefix)?;
                    let Some(entry) = entries.next() else {
                        break;
                    };
                    walk.visits += 1;
                    if walk.visits > max_visits {
                        return Err(ObjectError::TooManyEntries(max_visits as u64).into());
                    }
                    // A directory removed while it is read ends its entries (`getdents` says
                    // ENOENT); it is gone, as one removed before it was opened.
                    let entry = match entry.map_err(|e| map(path, e)) {
                        Ok(entry) => entry,
                        Err(ObjectError::NotFound(_)) => break,
                        Err(other) => return Err(other.into()),
                    };
                    let Ok(name) = entry.file_name().into_string() else {
                        continue; // not UTF-8: not a key anyone can ask for
                    };
                    let key = if path.is_empty() {
                        name.clone()
                    } else {
                        // Its exact size: a string grown by `format!` may hold twice its length.
                        let mut key = String::with_capacity(path.len() + 1 + name.len());
                        key.push_str(path);
                        key.push('/');
                        key.push_str(&name);
                        key
                    };
                    // An entry removed between the directory's read and its look (a writer's
                    // temporary file) is skipped: it failed the whole listing, which anyone
                    // who may write under the prefix could make every lister's fail.
                    let ft = match entry.file_type().map_err(|e| map(&key, e)) {
                        Ok(ft) => ft,
                        Err(ObjectError::NotFound(_)) => continue,
                        Err(other) => return Err(other.into()),
                    };
                    if ft.is_dir() {
                        // Nothing below a directory whose path is already a key's longest can
                        // be read: not walked (which bounds a walk's depth, and the segments
                        // each directory's opening goes through).
                        if key.len() < MAX_KEY_BYTES
                            && (key.starts_with(&prefix) || prefix.starts_with(&format!("{key}/")))
                        {
                            walk.to_walk.grow(string_bytes(&key))?;
                            walk.stack.push(key);
                        }
                    } else if ft.is_file() && key.starts_with(&prefix) && keep(&key) {
                        let meta = match entry.metadata().map_err(|e| map(&key, e)) {
                            Ok(meta) => meta,
                            Err(ObjectError::NotFound(_)) => continue,
                            Err(other) => return Err(other.into()),
                        };
                        walk.kept.push(ObjectMeta {
                            key,
                            size: meta.len(),
                            last_modified_ms: modified_ms(&meta),
                            etag: None,
                        })?;
                    }
                }
                walk.current = None;
            }
            Ok(walk.kept.take_sorted())
        })
        .await
    }
}

/// A listing's walk, kept between its steps.
struct Walk {
    /// The bucket, opened at the first step.
    bucket: Option<Dir>,
    /// The directory being read (its path) and its entries still to come.
    current: Option<(String, cap_std::fs::ReadDir)>,
    /// The directories still to walk.
    stack: Vec<String>,
    to_walk: Held,
    /// The smallest keys found so far.
    kept: Smallest,
    visits: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_job_whose_caller_went_away_stops_at_its_next_look() {
        let (looks, looked) = std::sync::mpsc::channel::<Result<(), ObjectError>>();
        let job = blocking(None, move |steps| {
            loop {
                let look = steps.go_on("big/prefix").map_err(|halt| match halt {
                    Halt::Stop(e) => e,
                    Halt::Wait(key) => ObjectError::Io(format!("told to wait, unpaced: {key}")),
                });
                let stop = look.is_err();
                looks.send(look).ok();
                if stop {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        // The caller gives up (an invocation stopped at its deadline drops its host call).
        assert!(
            tokio::time::timeout(Duration::from_millis(50), job)
                .await
                .is_err()
        );
        let give_up = Instant::now() + Duration::from_secs(5);
        let stopped = loop {
            match looked.recv_timeout(Duration::from_secs(5)) {
                Ok(Ok(())) if Instant::now() < give_up => continue,
                Ok(Err(e)) => break e,
                Ok(Ok(())) => panic!("the job still runs 5 s after its caller went away"),
                Err(e) => panic!("the job did not see that it was abandoned: {e}"),
            }
        };
        assert!(stopped.to_string().contains("big/prefix"), "{stopped}");
        assert!(
            looked.recv_timeout(Duration::from_secs(1)).is_err(),
            "the job ended there"
        );
    }

    /// A pace that has the job wait for its turn at every other look, and counts the waits;
    /// or (`never`) whose turn never comes.
    #[derive(Debug, Default)]
    struct EveryOther {
        looks: std::sync::atomic::AtomicUsize,
        waits: std::sync::atomic::AtomicUsize,
        never: bool,
    }

    impl Pace for EveryOther {
        fn pace(&self) -> bool {
            true
        }

        fn try_pace(&self) -> Option<bool> {
            use std::sync::atomic::Ordering::Relaxed;
            if self.looks.fetch_add(1, Relaxed).is_multiple_of(2) {
                self.waits.fetch_add(1, Relaxed);
                None
            } else {
                Some(true)
            }
        }

        fn turn(&self) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + '_>> {
            let never = self.never;
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                !never
            })
        }
    }

    /// A job that waits for its turn goes on where it stopped: a read gives every byte once, a
    /// walk every entry once; one whose turn never comes stops, its caller's time up.
    #[tokio::test]
    async fn a_job_that_waits_for_its_turn_goes_on_where_it_stopped() {
        use std::sync::atomic::Ordering::Relaxed;
        let dir = tempfile::tempdir().expect("tmp");
        let b = dir.path().join("b");
        std::fs::create_dir_all(b.join("many")).expect("bucket");
        let bytes: Vec<u8> = (0..(48 * READ_CHUNK)).map(|i| (i % 251) as u8).collect();
        std::fs::write(b.join("big"), &bytes).expect("object");
        for i in 0..300 {
            std::fs::write(b.join(format!("many/{i:03}")), b"x").expect("object");
        }
        let store = Local::open(dir.path()).expect("store");
        let every_other = Arc::new(EveryOther::default());
        let pace = Arc::clone(&every_other) as Arc<dyn Pace>;
        // The first look waits (the file open); later ones, once every other tick, within the
        // read (three times in all here).
        let length = bytes.len() as u64 - 5;
        let read = store
            .read("b", "big", 5, length, Some(&pace))
            .await
            .expect("read");
        assert!(read == bytes[5..], "the bytes read, each once, in order");
        let waits = every_other.waits.load(Relaxed);
        assert!(waits >= 1, "the read waited for its turn");
        // A walk of at least 300 ms (1 ms an object): about 15 waits at one every other tick.
        let keep = Arc::new(|_: &str| {
            std::thread::sleep(Duration::from_millis(1));
            true
        });
        let listed = store
            .list("b", "many/", 10_000, 100_000, keep, (Some(&pace), None))
            .await
            .expect("list");
        let keys: Vec<String> = listed.into_iter().map(|m| m.key).collect();
        let expected: Vec<String> = (0..300).map(|i| format!("many/{i:03}")).collect();
        assert_eq!(keys, expected, "every entry once");
        let walk_waits = every_other.waits.load(Relaxed) - waits;
        assert!(walk_waits >= 3, "the walk waited {walk_waits} times");
        // A turn that never comes: the job stops there.
        let never = Arc::new(EveryOther {
            never: true,
            ..EveryOther::default()
        }) as Arc<dyn Pace>;
        let stopped = store.read("b", "big", 0, 10, Some(&never)).await;
        assert!(
            matches!(&stopped, Err(ObjectError::Stopped(m)) if m.contains("big") && m.contains("time is up")),
            "{stopped:?}"
        );
    }

    /// Descriptors the process has open now.
    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
    }

    #[tokio::test]
    async fn a_walk_holds_a_few_descriptors_however_many_directories_it_finds() {
        let dir = tempfile::tempdir().expect("tmp");
        for class in 0..1000 {
            let d = dir.path().join(format!("b/train/{class:04}"));
            std::fs::create_dir_all(&d).expect("class directory");
            std::fs::write(d.join("0.png"), b"x").expect("object");
        }
        let store = Local::open(dir.path()).expect("store");
        let before = open_descriptors();
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = Arc::clone(&most);
        let keep = Arc::new(move |_: &str| {
            seen.fetch_max(open_descriptors(), std::sync::atomic::Ordering::Relaxed);
            true
        });
        let listed = store
            .list("b", "train/", 10_000, 100_000, keep, (None, None))
            .await
            .expect("list");
        assert_eq!(listed.len(), 1000);
        assert_eq!(listed[0].key, "train/0000/0.png");
        let most = most.load(std::sync::atomic::Ordering::Relaxed);
        // Other tests of this binary open files meanwhile: a margin, far below a thousand.
        assert!(
            most < before + 64,
            "{most} descriptors open during the walk, {before} before it"
        );
    }

    #[tokio::test]
    async fn an_object_removed_while_it_is_listed_is_skipped() {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path().join("b/p");
        std::fs::create_dir_all(&d).expect("directory");
        for name in ["1", "2", "3"] {
            std::fs::write(d.join(name), b"x").expect("object");
        }
        let store = Local::open(dir.path()).expect("store");
        // `keep` runs between the directory's read and the entry's look: the writer's race.
        let gone = d.join("2");
        let keep = Arc::new(move |key: &str| {
            if key == "p/2" {
                std::fs::remove_file(&gone).expect("remove");
            }
            true
        });
        let listed = store
            .list("b", "p/", 10, 100, keep, (None, None))
            .await
            .expect("the listing goes on past an object removed meanwhile");
        let keys: Vec<&str> = listed.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["p/1", "p/3"]);
    }

    #[tokio::test]
    async fn a_walks_directories_to_come_are_charged_to_its_caller() {
        let dir = tempfile::tempdir().expect("tmp");
        // 200 directories of 200-byte names: about 45 KB of paths waiting to be walked.
        for i in 0..200 {
            let d = dir.path().join(format!("b/wide/{i:03}{}", "d".repeat(197)));
            std::fs::create_dir_all(&d).expect("directory");
            std::fs::write(d.join("x"), b"x").expect("object");
        }
        let store = Local::open(dir.path()).expect("store");
        let keep = || Arc::new(|_: &str| true);
        let small = Account::new(16 << 10);
        let over = store
            .list("b", "wide/", 1, 100_000, keep(), (None, Some(&small)))
            .await;
        assert!(
            matches!(&over, Err(ObjectError::OverLimit(e)) if e.what.contains("directories")),
            "{over:?}"
        );
        assert_eq!(small.used(), 0, "released when the walk stopped");
        let large = Account::new(1 << 20);
        let listed = store
            .list("b", "wide/", 1, 100_000, keep(), (None, Some(&large)))
            .await
            .expect("within a MiB");
        assert_eq!(listed.len(), 1);
        assert!(
            large.peak() > 200 * 200,
            "the paths were charged: {}",
            large.peak()
        );
        assert_eq!(large.used(), 0, "released when the walk ended");
    }

    #[tokio::test]
    async fn reads_in_chunks_give_the_bytes_asked_for() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(dir.path().join("b")).expect("bucket");
        let bytes: Vec<u8> = (0..(5 * READ_CHUNK / 2)).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("b/k"), &bytes).expect("object");
        let store = Local::open(dir.path()).expect("store");
        for (offset, length) in [
            (0, bytes.len() as u64),
            (7, READ_CHUNK),
            (READ_CHUNK - 1, READ_CHUNK + 2),
            (0, 0),
            (bytes.len() as u64 - 3, 100),
        ] {
            let got = store
                .read("b", "k", offset, length, None)
                .await
                .expect("read");
            let end = (offset + length).min(bytes.len() as u64) as usize;
            assert_eq!(got, bytes[offset as usize..end], "{offset}+{length}");
        }
    }

    #[tokio::test]
    async fn a_key_through_a_symbolic_link_reaches_nothing() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().expect("tmp");
        let b = dir.path().join("b");
        for d in ["public", "private"] {
            std::fs::create_dir_all(b.join(d)).expect("prefix");
        }
        std::fs::write(b.join("public/x"), b"public").expect("object");
        std::fs::write(b.join("private/secret"), b"secret").expect("object");
        // Links inside the bucket, from a prefix one tenant is granted to one it is not.
        symlink("../private/secret", b.join("public/file")).expect("link to a file");
        symlink("../private", b.join("public/dir")).expect("link to a directory");
        let store = Local::open(dir.path()).expect("store");
        fn through_link<T>(r: &Result<T, ObjectError>) -> bool {
            matches!(r, Err(ObjectError::Denied(m)) if m.contains("symbolic link"))
        }
        for key in ["public/file", "public/dir/secret"] {
            let read = store.read("b", key, 0, 100, None).await;
            assert!(through_link(&read), "{key}: {read:?}");
            let head = store.head("b", key, None).await;
            assert!(through_link(&head), "{key}: {head:?}");
        }
        let keep = || Arc::new(|_: &str| true);
        let listed = store
            .list("b", "public/dir/", 10, 100, keep(), (None, None))
            .await;
        assert!(through_link(&listed), "{listed:?}");
        let listed = store
            .list("b", "public/", 10, 100, keep(), (None, None))
            .await
            .expect("list");
        let keys: Vec<_> = listed.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["public/x"], "a listing shows no link");
        let read = store.read("b", "public/x", 0, 100, None).await;
        assert_eq!(read.expect("a plain object"), b"public");
    }

    #[tokio::test]
    async fn a_fifo_is_refused_not_waited_on() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(dir.path().join("b")).expect("bucket");
        let fifo = std::ffi::CString::new(
            dir.path()
                .join("b/pipe")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .expect("path");
        // SAFETY: a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo");
        let store = Local::open(dir.path()).expect("store");
        for read in [
            tokio::time::timeout(Duration::from_secs(5), store.read("b", "pipe", 0, 10, None))
                .await
                .map(|r| r.map(|_| ())),
            tokio::time::timeout(Duration::from_secs(5), store.head("b", "pipe", None))
                .await
                .map(|r| r.map(|_| ())),
        ] {
            let read = read.expect("answered at once, not blocked until a writer comes");
            assert!(
                matches!(&read, Err(ObjectError::NotFound(m)) if m.contains("not a regular file")),
                "{read:?}"
            );
        }
    }
}
