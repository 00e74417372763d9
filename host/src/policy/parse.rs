//! From TOML text to a validated [`Policy`]: raw serde types that reject unknown keys, then
//! every value checked against its named range, with the key and line in every error.

use super::packages::PolicyModels;
use super::*;
use crate::units::{parse_duration, parse_size};
use serde::Deserialize;
use std::path::Path;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    host: RawHost,
    #[serde(default)]
    tenants: BTreeMap<String, Spanned<RawTenant>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    listen: Option<Spanned<String>>,
    store: Spanned<String>,
    models: Spanned<toml::Value>,
    measure_at_start: Option<bool>,
    state: Spanned<String>,
    device: Option<Spanned<String>>,
    memory_budget: Option<Spanned<String>>,
    batch_window: Option<Spanned<String>>,
    adapt_batch: Option<bool>,
    pool: Option<bool>,
    max_batch: Option<Spanned<i64>>,
    slice: Option<Spanned<String>>,
    batch_time: Option<Spanned<String>>,
    resident_for: Option<Spanned<String>>,
    max_request: Option<Spanned<String>>,
    keep_resident: Option<Spanned<String>>,
    operator_token_sha256: Option<Spanned<String>>,
    metrics_listen: Option<Spanned<String>>,
    max_connections: Option<Spanned<i64>>,
    max_connections_per_client: Option<Spanned<i64>>,
    header_timeout: Option<Spanned<String>>,
    body_timeout: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
    shutdown_timeout: Option<Spanned<String>>,
    workers: Option<Spanned<i64>>,
    device_workers: Option<Spanned<i64>>,
    s3: Option<RawS3>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawS3 {
    #[serde(default)]
    endpoint: String,
    #[serde(default = "default_region")]
    region: String,
    access_key_id: Option<Spanned<String>>,
    secret_access_key: Option<Spanned<String>>,
    seaweedfs_filer: Option<Spanned<String>>,
    local_volume_server: Option<Spanned<String>>,
}

fn default_region() -> String {
    "us-east-1".into()
}

/// `host.s3.seaweedfs_filer` and `host.s3.local_volume_server`: both or neither, each an
/// `http://` or `https://` URL.
fn locality(ctx: &Ctx<'_>, s: &RawS3) -> Result<Option<Locality>, PolicyError> {
    let url = |key: &str, v: &Spanned<String>| -> Result<String, PolicyError> {
        let text = v.get_ref().trim_end_matches('/');
        let ok = ["http://", "https://"].iter().any(|p| {
            text.strip_prefix(p)
                .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', '?', '#', ' ']))
        });
        if ok {
            Ok(text.to_string())
        } else {
            ctx.err(
                v.span(),
                format!(
                    "host.s3.{key} = {:?}: expected http://host:port",
                    v.get_ref()
                ),
            )
        }
    };
    match (&s.seaweedfs_filer, &s.local_volume_server) {
        (None, None) => Ok(None),
        (Some(f), Some(v)) => Ok(Some(Locality {
            filer: url("seaweedfs_filer", f)?,
            volume_server: url("local_volume_server", v)?,
        })),
        (Some(one), None) | (None, Some(one)) => ctx.err(
            one.span(),
            "host.s3.seaweedfs_filer and host.s3.local_volume_server go together".into(),
        ),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    bucket: Spanned<String>,
    #[serde(default)]
    prefix: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    token_sha256: Spanned<String>,
    #[serde(default)]
    grants: Vec<Spanned<RawGrant>>,
    #[serde(default)]
    models: Vec<Spanned<String>>,
    private_models: Option<Spanned<toml::Value>>,
    memory: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    max_output: Option<Spanned<String>>,
    max_object: Option<Spanned<String>>,
    max_read: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
    queue: Option<Spanned<i64>>,
    weight: Option<Spanned<i64>>,
    deploy: Option<bool>,
    max_functions: Option<Spanned<i64>>,
    max_function_bytes: Option<Spanned<String>>,
    compile_share: Option<Spanned<i64>>,
    compile_burst: Option<Spanned<String>>,
    #[serde(default)]
    capabilities: Vec<Spanned<String>>,
    #[serde(default)]
    functions: BTreeMap<String, Spanned<String>>,
}

/// Where errors point: the file's name, its text (for line numbers) and its directory.
struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
    base: &'a Path,
}

fn fmt_size(n: u64) -> String {
    crate::units::format_size(n)
}

impl Ctx<'_> {
    fn line_of(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    fn err<T>(&self, span: std::ops::Range<usize>, message: String) -> Result<T, PolicyError> {
        Err(PolicyError {
            file: self.file.to_string(),
            line: Some(self.line_of(span.start)),
            message,
        })
    }

    /// A byte size within `min..=max`; `fallback` is where an absent key's error points.
    fn size(
        &self,
        key: &str,
        v: &Option<Spanned<String>>,
        default: u64,
        (min, max): (u64, u64),
    ) -> Result<u64, PolicyError> {
        let Some(s) = v else { return Ok(default) };
        let n = parse_size(s.get_ref()).or_else(|e| self.err(s.span(), format!("{key}: {e}")))?;
        if !(min..=max).contains(&n) {
            return self.err(
                s.span(),
                format!("{key}: must be {}..={}", fmt_size(min), fmt_size(max)),
            );
        }
        Ok(n)
    }

    fn duration(
        &self,
        key: &str,
        v: &Option<Spanned<String>>,
        default: Duration,
        (min, max): (Duration, Duration),
    ) -> Result<Duration, PolicyError> {
        let Some(s) = v else { return Ok(default) };
        let d =
            parse_duration(s.get_ref()).or_else(|e| self.err(s.span(), format!("{key}: {e}")))?;
        if !(min..=max).contains(&d) {
            return self.err(s.span(), format!("{key}: must be {min:?}..={max:?}"));
        }
        Ok(d)
    }

    fn int(
        &self,
        key: &str,
        v: &Option<Spanned<i64>>,
        default: u64,
        (min, max): (u64, u64),
    ) -> Result<u64, PolicyError> {
        match v {
            None => Ok(default),
            Some(s) => match u64::try_from(*s.get_ref()) {
                Ok(n) if (min..=max).contains(&n) => Ok(n),
                _ => self.err(
                    s.span(),
                    format!("{key} = {}: must be {min}..={max}", s.get_ref()),
                ),
            },
        }
    }

    /// A directory or a list of them (at least one, none twice).
    fn paths(&self, key: &str, v: &Spanned<toml::Value>) -> Result<Vec<PathBuf>, PolicyError> {
        let items: Vec<&toml::Value> = match v.get_ref() {
            toml::Value::Array(a) => a.iter().collect(),
            one => vec![one],
        };
        let mut dirs = Vec::with_capacity(items.len());
        for item in items {
            let Some(s) = item.as_str().filter(|s| !s.is_empty()) else {
                return self.err(
                    v.span(),
                    format!(
                        "{key}: expected a directory or a list of directories, got a {}",
                        item.type_str()
                    ),
                );
            };
            let dir = self.base.join(s);
            if dirs.contains(&dir) {
                return self.err(v.span(), format!("{key}: {s:?} is listed twice"));
            }
            dirs.push(dir);
        }
        if dirs.is_empty() {
            return self.err(v.span(), format!("{key}: the list is empty"));
        }
        Ok(dirs)
    }

    fn path(&self, v: &Spanned<String>) -> PathBuf {
        let p = Path::new(v.get_ref().strip_prefix("file://").unwrap_or(v.get_ref()));
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }

    fn addr(&self, key: &str, v: &Spanned<String>) -> Result<SocketAddr, PolicyError> {
        v.get_ref()
            .parse()
            .or_else(|e| self.err(v.span(), format!("{key} = {:?}: {e}", v.get_ref())))
    }

    fn sha256(&self, key: &str, v: &Spanned<String>) -> Result<[u8; 32], PolicyError> {
        parse_sha256(v.get_ref()).ok_or(()).or_else(|()| {
            self.err(
                v.span(),
                format!("{key}: expected 64 hex digits (sha256 of the token)"),
            )
        })
    }
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The names of the model packages under `dir` (their manifests' names).
impl Policy {
    /// Reads and validates the policy file at `path`, including that every model a tenant is
    /// granted exists in the host's models directory. Relative paths in it are relative to the
    /// file's directory.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError {
            file: file.clone(),
            line: None,
            message: e.to_string(),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        // The models directories are known only once the policy is read: parse twice, the
        // second time with the packages they hold.
        let first = Self::parse(&file, &text, base)?;
        let models = PolicyModels::read(&first).map_err(|message| PolicyError {
            file: file.clone(),
            line: None,
            message,
        })?;
        Self::parse_with(&file, &text, base, Some(&models))
    }

    /// Parses policy text; `file` names it in errors. Model names are not checked.
    pub fn parse(file: &str, text: &str, base: &Path) -> Result<Self, PolicyError> {
        Self::parse_with(file, text, base, None)
    }

    /// Parses policy text, checking tenants' model names against the packages `models` found
    /// when given.
    pub fn parse_with(
        file: &str,
        text: &str,
        base: &Path,
        models: Option<&PolicyModels>,
    ) -> Result<Self, PolicyError> {
        let ctx = Ctx { file, text, base };
        let raw: RawPolicy = toml::from_str(text).map_err(|e| PolicyError {
            file: file.to_string(),
            line: e.span().map(|s| ctx.line_of(s.start)),
            message: e.message().to_string(),
        })?;
        let host = host_settings(&ctx, &raw.host)?;
        let mut tenants = BTreeMap::new();
        let mut tokens = BTreeMap::new();
        let s3 = matches!(host.store, StoreLocation::S3(_));
        for (name, t) in &raw.tenants {
            let tenant = tenant(&ctx, name, t, models, s3)?;
            // A tenant's state (`functions/<tenant>`, `compiled/<tenant>`) is a directory of
            // its name: on a case-insensitive file system two such names would share it.
            if let Some(other) = tenants
                .keys()
                .find(|o: &&String| o.eq_ignore_ascii_case(name))
            {
                return ctx.err(
                    t.span(),
                    format!(
                        "tenant names `{other}` and `{name}` differ only in case: their state \
                         directories would be one on a case-insensitive file system"
                    ),
                );
            }
            if let Some(other) = tokens.insert(tenant.token_sha256, name.clone()) {
                return ctx.err(
                    t.get_ref().token_sha256.span(),
                    format!("tenants.{name}.token_sha256: same token as tenant `{other}`"),
                );
            }
            if host.operator_token_sha256 == Some(tenant.token_sha256) {
                return ctx.err(
                    t.get_ref().token_sha256.span(),
                    format!("tenants.{name}.token_sha256: same token as the operator's"),
                );
            }
            tenants.insert(name.clone(), Arc::new(tenant));
        }
        separate_directories(&ctx, &raw, &host, &tenants)?;
        private_apart_from_shared(&ctx, &raw, &host, &tenants)?;
        let invocations: usize = tenants.values().map(|t| t.limits.concurrency).sum();
        if invocations > MAX_INVOCATIONS
            && let Some(last) = raw.tenants.values().last()
        {
            return ctx.err(
                last.span(),
                format!(
                    "the tenants' `concurrency` adds up to {invocations}: a host runs at most \
                     {} invocations at once (its instance pool); lower some tenants' concurrency",
                    MAX_INVOCATIONS
                ),
            );
        }
        let mut host = host;
        if raw.host.shutdown_timeout.is_none() {
            // An invocation to its deadline, or an upload's body to the body timeout.
            let longest = tenants.values().map(|t| t.limits.timeout).max();
            host.http.shutdown_timeout =
                longest.unwrap_or_default().max(host.http.body_timeout) + SHUTDOWN_SLACK;
        }
        Ok(Policy { host, tenants })
    }
}

/// The host's own directories (state, shared and private model packages) are not inside a
/// local store, where a grant on the bucket of that name would read them (every tenant's
/// uploaded code, a tenant's private weights), nor around it, where a grant on a bucket would
/// read one of their subdirectories (`store = "<state>/functions"`: a grant on `bob` read
/// bob's uploaded code). (Tenants may share a `private_models` directory: the operator's
/// choice; packages are found one level down, so one directory inside another exposes
/// nothing.)
fn separate_directories(
    ctx: &Ctx<'_>,
    raw: &RawPolicy,
    host: &HostSettings,
    tenants: &BTreeMap<String, Arc<Tenant>>,
) -> Result<(), PolicyError> {
    let StoreLocation::Local(store) = &host.store else {
        return Ok(());
    };
    let mut spans = vec![raw.host.state.span()];
    spans.extend(host.models.iter().map(|_| raw.host.models.span()));
    spans.extend(tenants.iter().flat_map(|(name, t)| {
        t.private_models
            .iter()
            .map(|_| private_models_span(raw, name))
    }));
    match overlapping(store, own_directories(&host.state, host, tenants)) {
        Ok(()) => Ok(()),
        Err((i, message)) => ctx.err(spans.swap_remove(i), message),
    }
}

/// The host's own directories as `policy` gives them, with `state` (the one in force), named
/// by their keys, in the order [`separate_directories`] gives their spans.
fn own_directories<'a>(
    state: &'a Path,
    host: &'a HostSettings,
    tenants: &'a BTreeMap<String, Arc<Tenant>>,
) -> Vec<(String, &'a Path)> {
    let mut own = vec![("host.state".to_string(), state)];
    own.extend(
        host.models
            .iter()
            .map(|m| ("host.models".to_string(), m.as_path())),
    );
    for (name, t) in tenants {
        for dir in &t.private_models {
            own.push((format!("tenants.{name}.private_models"), dir.as_path()));
        }
    }
    own
}

/// The first of `own` inside the store at `store` or around it: its index, and why.
fn overlapping(store: &Path, own: Vec<(String, &Path)>) -> Result<(), (usize, String)> {
    let at = resolved(store);
    for (i, (key, dir)) in own.into_iter().enumerate() {
        let d = resolved(dir);
        let (dir, store) = (dir.display().to_string(), store.display().to_string());
        if d.starts_with(&at) {
            return Err((
                i,
                format!(
                    "{key} = {dir:?} is inside host.store ({store:?}): a grant on that bucket \
                     would read it; keep the host's directories outside the store"
                ),
            ));
        }
        if at.starts_with(&d) {
            return Err((
                i,
                format!(
                    "{key} = {dir:?} holds host.store ({store:?}): a grant on a bucket would \
                     read one of its directories; keep the store outside the host's directories"
                ),
            ));
        }
    }
    Ok(())
}

impl Policy {
    /// Whether this policy, loaded into a host that runs with `running`'s store and state
    /// (both kept until a restart), keeps its directories apart from that store, as
    /// [`separate_directories`] checks for the policy's own store: a reload that changes
    /// `store` (not applied until a restart) passed that check against the new store while
    /// the old one served, so that a tenant's `private_models` moved into the old store was
    /// read through a grant on its bucket.
    pub fn apart_from_store_of(&self, running: &HostSettings) -> Result<(), String> {
        let StoreLocation::Local(store) = &running.store else {
            return Ok(());
        };
        overlapping(
            store,
            own_directories(&running.state, &self.host, &self.tenants),
        )
        .map_err(|(_, message)| message)
    }
}

/// No tenant's `private_models` directory is a `host.models` directory (also through a link
/// or `..`): every shared package in it would be that tenant's own, whatever its `models` list
/// grants, and loaded twice. (A directory above or below one of them holds no package one
/// level down that the other does.)
fn private_apart_from_shared(
    ctx: &Ctx<'_>,
    raw: &RawPolicy,
    host: &HostSettings,
    tenants: &BTreeMap<String, Arc<Tenant>>,
) -> Result<(), PolicyError> {
    let shared: Vec<PathBuf> = host.models.iter().map(|m| resolved(m)).collect();
    for (name, t) in tenants {
        for dir in &t.private_models {
            if shared.contains(&resolved(dir)) {
                return ctx.err(
                    private_models_span(raw, name),
                    format!(
                        "tenants.{name}.private_models = {:?} is a host.models directory: every \
                         shared package in it would be this tenant's own, whatever its models \
                         list grants; give the tenant a directory of its own packages",
                        dir.display().to_string()
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Where tenant `name`'s `private_models` is written in the policy (its table, where it has
/// none).
fn private_models_span(raw: &RawPolicy, name: &str) -> std::ops::Range<usize> {
    let tenant = &raw.tenants[name];
    tenant
        .get_ref()
        .private_models
        .as_ref()
        .map_or_else(|| tenant.span(), Spanned::span)
}

/// `p` as the file system resolves it: made absolute, its longest existing part with links
/// followed (a link's `..` goes up from where the link leads), and only the rest, which does
/// not exist yet, taken lexically; so that neither a link nor `..` hides one directory inside
/// another.
fn resolved(p: &Path) -> PathBuf {
    use std::path::Component;
    let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let parts: Vec<Component<'_>> = p.components().collect();
    for k in (1..=parts.len()).rev() {
        let head: PathBuf = parts[..k].iter().collect();
        if let Ok(mut out) = std::fs::canonicalize(&head) {
            for c in &parts[k..] {
                match c {
                    Component::ParentDir => {
                        out.pop();
                    }
                    Component::Normal(name) => out.push(name),
                    _ => {}
                }
            }
            return out;
        }
    }
    p
}

fn host_settings(ctx: &Ctx<'_>, h: &RawHost) -> Result<HostSettings, PolicyError> {
    let listen = match &h.listen {
        None => SocketAddr::from(([127, 0, 0, 1], 8080)),
        Some(s) => ctx.addr("host.listen", s)?,
    };
    let device = match &h.device {
        None => "auto".to_string(),
        Some(s) => {
            let d = s.get_ref();
            let ok = d == "auto"
                || d == "cpu"
                || d == "cuda"
                || d.strip_prefix("cuda:")
                    .is_some_and(|n| n.parse::<u32>().is_ok());
            if !ok {
                return ctx.err(
                    s.span(),
                    format!("host.device = {d:?}: expected auto, cpu, cuda or cuda:N"),
                );
            }
            d.clone()
        }
    };
    let store = match h.store.get_ref().as_str() {
        "s3://" => {
            let s3 = match h.s3.as_ref() {
                None => S3Settings {
                    endpoint: String::new(),
                    region: default_region(),
                    access_key_id: None,
                    secret_access_key: None,
                    locality: None,
                },
                Some(s) => {
                    // One without the other would be ignored, and the store reached with the
                    // environment's credentials (`AWS_*`, an instance role): maybe not the
                    // ones the operator meant.
                    match (&s.access_key_id, &s.secret_access_key) {
                        (Some(one), None) | (None, Some(one)) => {
                            return ctx.err(
                                one.span(),
                                "host.s3: set access_key_id and secret_access_key together, or neither (to use the environment's credentials)".into(),
                            );
                        }
                        _ => {}
                    }
                    S3Settings {
                        endpoint: s.endpoint.clone(),
                        region: s.region.clone(),
                        access_key_id: s.access_key_id.as_ref().map(|k| k.get_ref().clone()),
                        secret_access_key: s
                            .secret_access_key
                            .as_ref()
                            .map(|k| k.get_ref().clone()),
                        locality: locality(ctx, s)?,
                    }
                }
            };
            StoreLocation::S3(s3)
        }
        other if other.contains("://") && !other.starts_with("file://") => {
            return ctx.err(
                h.store.span(),
                format!("host.store = {other:?}: expected a directory, file:///path or s3://"),
            );
        }
        _ => {
            if h.s3.is_some() {
                return ctx.err(
                    h.store.span(),
                    "host.s3 is set but host.store is not \"s3://\"".into(),
                );
            }
            StoreLocation::Local(ctx.path(&h.store))
        }
    };
    let d = HttpSettings::default();
    let max_connections = ctx.int(
        "host.max_connections",
        &h.max_connections,
        d.max_connections as u64,
        (1, MAX_CONNECTIONS),
    )? as usize;
    let per_client = ctx.int(
        "host.max_connections_per_client",
        &h.max_connections_per_client,
        (d.max_connections_per_client.min(max_connections)) as u64,
        (1, max_connections as u64),
    )? as usize;
    let http = HttpSettings {
        max_connections,
        max_connections_per_client: per_client,
        header_timeout: ctx.duration(
            "host.header_timeout",
            &h.header_timeout,
            d.header_timeout,
            HTTP_TIMEOUT_RANGE,
        )?,
        body_timeout: ctx.duration(
            "host.body_timeout",
            &h.body_timeout,
            d.body_timeout,
            HTTP_TIMEOUT_RANGE,
        )?,
        idle_timeout: ctx.duration(
            "host.idle_timeout",
            &h.idle_timeout,
            d.idle_timeout,
            HTTP_TIMEOUT_RANGE,
        )?,
        // Set from the tenants' timeouts when not given (`Policy::parse_with`).
        shutdown_timeout: ctx.duration(
            "host.shutdown_timeout",
            &h.shutdown_timeout,
            d.shutdown_timeout,
            HTTP_TIMEOUT_RANGE,
        )?,
        max_request: ctx.size(
            "host.max_request",
            &h.max_request,
            d.max_request as u64,
            MAX_REQUEST_RANGE,
        )? as usize,
    };
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    Ok(HostSettings {
        listen,
        store,
        models: ctx.paths("host.models", &h.models)?,
        measure_at_start: h.measure_at_start.unwrap_or(true),
        state: ctx.path(&h.state),
        device,
        memory_budget: ctx.size(
            "host.memory_budget",
            &h.memory_budget,
            4 << 30,
            (MIN_MEMORY_BUDGET, u64::MAX >> 2),
        )?,
        batch_window: ctx.duration(
            "host.batch_window",
            &h.batch_window,
            Duration::from_millis(2),
            (Duration::ZERO, MAX_BATCH_WINDOW),
        )?,
        adapt_batch: h.adapt_batch.unwrap_or(true),
        pool: h.pool.unwrap_or(true),
        max_batch: ctx.int("host.max_batch", &h.max_batch, 32, (1, MAX_MAX_BATCH))? as i64,
        slice: ctx.duration(
            "host.slice",
            &h.slice,
            Duration::from_millis(50),
            SLICE_RANGE,
        )?,
        batch_time: ctx.duration(
            "host.batch_time",
            &h.batch_time,
            Duration::from_millis(300),
            SLICE_RANGE,
        )?,
        resident_for: ctx.duration(
            "host.resident_for",
            &h.resident_for,
            Duration::from_secs(30),
            (Duration::ZERO, MAX_RESIDENT_FOR),
        )?,
        keep_resident: ctx.size(
            "host.keep_resident",
            &h.keep_resident,
            0,
            (0, MAX_KEEP_RESIDENT),
        )?,
        http,
        operator_token_sha256: h
            .operator_token_sha256
            .as_ref()
            .map(|s| ctx.sha256("host.operator_token_sha256", s))
            .transpose()?,
        metrics_listen: h
            .metrics_listen
            .as_ref()
            .map(|s| ctx.addr("host.metrics_listen", s))
            .transpose()?,
        workers: ctx.int("host.workers", &h.workers, cores, (1, MAX_WORKERS))? as usize,
        device_workers: h
            .device_workers
            .as_ref()
            .map(|_| {
                ctx.int(
                    "host.device_workers",
                    &h.device_workers,
                    1,
                    (1, MAX_WORKERS),
                )
            })
            .transpose()?
            .map(|n| n as usize),
    })
}

/// An S3 bucket name as AWS (and SeaweedFS, MinIO) accept it, within [`valid_name`]'s
/// characters.
fn valid_s3_bucket(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

fn tenant(
    ctx: &Ctx<'_>,
    name: &str,
    t: &Spanned<RawTenant>,
    known_models: Option<&PolicyModels>,
    s3: bool,
) -> Result<Tenant, PolicyError> {
    let span = t.span();
    let t = t.get_ref();
    let key = |k: &str| format!("tenants.{name}.{k}");
    if !valid_name(name) {
        return ctx.err(
            span,
            format!("tenant name `{name}`: use letters, digits, `-` and `_` (at most 64)"),
        );
    }
    let token_sha256 = ctx.sha256(&key("token_sha256"), &t.token_sha256)?;
    let mut grants = Vec::new();
    for g in &t.grants {
        let g = g.get_ref();
        let bucket = g.bucket.get_ref();
        if !valid_name(bucket) {
            return ctx.err(
                g.bucket.span(),
                format!(
                    "{}: bucket `{bucket}`: use letters, digits, `-` and `_`",
                    key("grants")
                ),
            );
        }
        // S3 refuses other names: every read of such a bucket would fail as the store's fault.
        if s3 && !valid_s3_bucket(bucket) {
            return ctx.err(
                g.bucket.span(),
                format!(
                    "{}: bucket `{bucket}`: an S3 bucket's name is 3 to 63 lowercase letters, digits and `-`, beginning and ending with a letter or digit",
                    key("grants")
                ),
            );
        }
        let prefix = g
            .prefix
            .as_ref()
            .map(|p| p.get_ref().clone())
            .unwrap_or_default();
        // Checked as a listing's prefix is: a prefix no key can have (an empty segment, as in
        // `a//b/`) would grant nothing, silently.
        if let Err(e) = crate::store::keys::check_prefix(&prefix) {
            let span = g.prefix.as_ref().map_or(g.bucket.span(), Spanned::span);
            return ctx.err(
                span,
                format!(
                    "{}: prefix `{prefix}` must be relative, without empty, `.` or `..` segments, at most {} bytes ({e})",
                    key("grants"),
                    hapi_wire::invoke::MAX_KEY_BYTES
                ),
            );
        }
        grants.push(Grant {
            bucket: bucket.clone(),
            prefix,
        });
    }
    let mut models = BTreeSet::new();
    for m in &t.models {
        let model = m.get_ref();
        if let Some(known) = known_models
            && !known.shared.contains_key(model)
        {
            return ctx.err(
                m.span(),
                format!(
                    "{}: no model package `{model}` in host.models (it has: {})",
                    key("models"),
                    known.shared.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
        }
        models.insert(model.clone());
    }
    let private_models = match &t.private_models {
        None => Vec::new(),
        Some(v) => ctx.paths(&key("private_models"), v)?,
    };
    // A name the tenant uses must mean one package.
    if let (Some(known), Some(v)) = (known_models, &t.private_models)
        && let Some(mine) = known.private.get(name)
        && let Some((clash, f)) = mine.iter().find(|(n, _)| models.contains(*n))
    {
        return ctx.err(
            v.span(),
            format!(
                "{}: package `{clash}` ({}) has the name of a shared model in {}; rename one",
                key("private_models"),
                f.dir.display(),
                key("models")
            ),
        );
    }
    let d = Limits::default();
    let limits = Limits {
        memory: ctx.size(
            &key("memory"),
            &t.memory,
            d.memory,
            (MIN_GUEST_MEMORY, MAX_GUEST_MEMORY),
        )?,
        timeout: ctx.duration(
            &key("timeout"),
            &t.timeout,
            d.timeout,
            (Duration::from_millis(1), MAX_TIMEOUT),
        )?,
        max_output: ctx.size(
            &key("max_output"),
            &t.max_output,
            d.max_output,
            MAX_OUTPUT_RANGE,
        )?,
        max_object: ctx.size(
            &key("max_object"),
            &t.max_object,
            d.max_object,
            (1, MAX_READ_CAP),
        )?,
        max_read: ctx.size(&key("max_read"), &t.max_read, d.max_read, (1, MAX_READ_CAP))?,
        concurrency: ctx.int(
            &key("concurrency"),
            &t.concurrency,
            d.concurrency as u64,
            (1, MAX_CONCURRENCY),
        )? as usize,
        queue: ctx.int(&key("queue"), &t.queue, d.queue as u64, (0, MAX_QUEUE))? as usize,
        weight: ctx.int(
            &key("weight"),
            &t.weight,
            u64::from(d.weight),
            (1, MAX_WEIGHT),
        )? as u32,
        max_functions: ctx.int(
            &key("max_functions"),
            &t.max_functions,
            d.max_functions as u64,
            (0, MAX_FUNCTIONS),
        )? as usize,
        max_function_bytes: ctx.size(
            &key("max_function_bytes"),
            &t.max_function_bytes,
            d.max_function_bytes,
            (0, MAX_FUNCTION_BYTES),
        )?,
        compile_share: ctx.int(
            &key("compile_share"),
            &t.compile_share,
            u64::from(d.compile_share),
            (1, 100),
        )? as u32,
        compile_burst: ctx.duration(
            &key("compile_burst"),
            &t.compile_burst,
            d.compile_burst,
            (Duration::from_millis(1), MAX_COMPILE_BURST),
        )?,
    };
    let mut capabilities = Capabilities::default();
    for c in &t.capabilities {
        match c.get_ref().as_str() {
            "clocks" => capabilities.clocks = true,
            "random" => capabilities.random = true,
            other => {
                return ctx.err(
                    c.span(),
                    format!(
                        "{}: unknown capability `{other}` (known: clocks, random)",
                        key("capabilities")
                    ),
                );
            }
        }
    }
    let mut functions = BTreeMap::new();
    for (fname, path) in &t.functions {
        if !valid_name(fname) {
            return ctx.err(
                path.span(),
                format!(
                    "{}: function name `{fname}`: use letters, digits, `-` and `_`",
                    key("functions")
                ),
            );
        }
        functions.insert(fname.clone(), ctx.path(path));
    }
    Ok(Tenant {
        name: name.to_string(),
        token_sha256,
        grants,
        models,
        private_models,
        limits,
        deploy: t.deploy.unwrap_or(false),
        capabilities,
        functions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> String {
        "[host]\nstore = \"s\"\nmodels = \"m\"\nstate = \"x\"\n".to_string()
    }

    proptest! {
        /// Arbitrary text: a policy or an error naming the file, never a panic.
        #[test]
        fn arbitrary_text_parses_or_fails_cleanly(text in ".{0,300}") {
            if let Err(e) = Policy::parse("p.toml", &text, Path::new("/")) {
                prop_assert!(e.to_string().starts_with("p.toml"));
            }
        }

        /// Every host and tenant key with arbitrary values: a policy whose values are within
        /// their ranges, or an error that names the key and a line.
        #[test]
        fn arbitrary_values_are_in_range_or_named(
            key in prop::sample::select(vec![
                "memory", "timeout", "max_output", "max_object", "max_read", "concurrency",
                "queue", "weight", "max_functions", "max_function_bytes", "compile_share",
                "compile_burst",
            ]),
            host_key in prop::sample::select(vec![
                "memory_budget", "batch_window", "max_batch", "slice", "batch_time", "resident_for",
                "max_request",
                "keep_resident",
                "max_connections", "max_connections_per_client", "header_timeout",
                "body_timeout", "idle_timeout", "workers", "device_workers",
            ]),
            value in prop_oneof![
                any::<i64>().prop_map(|n| n.to_string()),
                "[0-9]{1,22}(B|KB|MiB|GiB|TiB|ms|s|m|h|x)?".prop_map(|s| format!("\"{s}\"")),
            ],
            on_host in any::<bool>(),
        ) {
            let text = if on_host {
                format!("{}{host_key} = {value}\n", header())
            } else {
                format!(
                    "{}[tenants.a]\ntoken_sha256 = \"{}\"\n{key} = {value}\n",
                    header(),
                    "ab".repeat(32)
                )
            };
            match Policy::parse("p.toml", &text, Path::new("/")) {
                Ok(p) => {
                    prop_assert!(p.host.memory_budget >= MIN_MEMORY_BUDGET);
                    prop_assert!(p.host.batch_window <= MAX_BATCH_WINDOW);
                    prop_assert!(p.host.resident_for <= MAX_RESIDENT_FOR);
                    prop_assert!(p.host.keep_resident <= MAX_KEEP_RESIDENT);
                    if let Some(t) = p.tenants.get("a") {
                        prop_assert!(t.limits.memory >= MIN_GUEST_MEMORY);
                        prop_assert!(!t.limits.timeout.is_zero());
                        prop_assert!(t.limits.max_output >= MAX_OUTPUT_RANGE.0);
                        prop_assert!(t.limits.max_read >= 1 && t.limits.max_object >= 1);
                        prop_assert!(t.limits.concurrency >= 1);
                    }
                }
                Err(e) => {
                    // The error points at the key's own line (5 on the host, 7 in the tenant).
                    prop_assert_eq!(e.line, Some(if on_host { 5 } else { 7 }), "{}", e);
                    let named = if on_host { format!("host.{host_key}") } else { format!("tenants.a.{key}") };
                    // Values of the right type are named by key; others get TOML's own words.
                    const INTEGER_KEYS: [&str; 10] = ["concurrency", "queue", "weight",
                        "max_functions", "compile_share", "max_batch", "max_connections",
                        "max_connections_per_client", "workers", "device_workers"];
                    let integer = INTEGER_KEYS.contains(&if on_host { host_key } else { key });
                    let typed = value.starts_with('"') != integer;
                    prop_assert!(!typed || e.message.contains(&named) || e.message.contains("too large"), "{}", e);
                }
            }
        }
    }
}
