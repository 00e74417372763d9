//! An S3 service, through `object_store`, one client per bucket.

use super::error::{ObjectError, ObjectMeta, Smallest};
use crate::account::Account;
use crate::account::text::quote;
use crate::policy::S3Settings;
use object_store::ObjectStoreExt;
use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::client::HttpRequestBody;
use object_store::path::Path;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Most bytes of one listing page read (S3 sends at most 1,000 keys of at most 1 KiB a page,
/// about 1.5 MB of XML).
const MAX_LIST_PAGE: usize = 16 << 20;

pub struct S3 {
    settings: S3Settings,
    clients: Mutex<HashMap<String, Arc<AmazonS3>>>,
    /// The listings' client (object_store's time limits: 5 s to connect, 30 s a request).
    http: reqwest::Client,
    locality: Option<super::locality::Locality>,
}

/// A page of `ListObjectsV2`.
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListPage {
    #[serde(default)]
    contents: Vec<Listed>,
    #[serde(default)]
    is_truncated: bool,
    next_continuation_token: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Listed {
    key: String,
    size: u64,
    last_modified: String,
    #[serde(rename = "ETag")]
    e_tag: Option<String>,
}

impl std::fmt::Debug for S3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3")
            .field("endpoint", &self.settings.endpoint)
            .finish_non_exhaustive()
    }
}

fn map(key: &str, e: object_store::Error) -> ObjectError {
    match e {
        object_store::Error::NotFound { .. } => ObjectError::NotFound(quote(key)),
        object_store::Error::InvalidPath { .. } => ObjectError::Denied(quote(key)),
        e => ObjectError::Io(format!("{}: {e}", quote(key))),
    }
}

fn meta(m: object_store::ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        key: m.location.to_string(),
        size: m.size,
        last_modified_ms: m.last_modified.timestamp_millis().max(0) as u64,
        etag: m.e_tag,
    }
}

impl S3 {
    pub fn new(settings: S3Settings) -> Self {
        Self {
            locality: settings
                .locality
                .clone()
                .map(super::locality::Locality::new),
            settings,
            clients: Mutex::default(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap_or_default(),
        }
    }

    /// Reading replicas from the local volume server, when the policy sets it up.
    pub fn locality(&self) -> Option<&super::locality::Locality> {
        self.locality.as_ref()
    }

    fn client(&self, bucket: &str) -> Result<Arc<AmazonS3>, ObjectError> {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = clients.get(bucket) {
            return Ok(Arc::clone(c));
        }
        let s = &self.settings;
        let mut b = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_region(&s.region)
            .with_allow_http(s.endpoint.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
        if !s.endpoint.is_empty() {
            b = b.with_endpoint(&s.endpoint);
        }
        if let (Some(id), Some(secret)) = (&s.access_key_id, &s.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        }
        let client = Arc::new(
            b.build()
                .map_err(|e| ObjectError::Io(format!("bucket `{}`: {e}", quote(bucket))))?,
        );
        clients.insert(bucket.to_string(), Arc::clone(&client));
        Ok(client)
    }

    /// The path-style URL of `bucket` (object_store's requests are path-style too).
    fn bucket_url(&self, bucket: &str) -> Result<reqwest::Url, ObjectError> {
        let failed = |e: String| ObjectError::Io(format!("bucket `{}`: {e}", quote(bucket)));
        let s = &self.settings;
        let endpoint = if s.endpoint.is_empty() {
            format!("https://s3.{}.amazonaws.com", s.region)
        } else {
            s.endpoint.trim_end_matches('/').to_string()
        };
        let mut url =
            reqwest::Url::parse(&endpoint).map_err(|e| failed(format!("{endpoint}: {e}")))?;
        url.path_segments_mut()
            .map_err(|()| failed(format!("{endpoint}: not a base URL")))?
            .pop_if_empty()
            .push(bucket);
        Ok(url)
    }

    /// One page of `ListObjectsV2` of `prefix` in `bucket` (at `bucket_url`), signed with
    /// `client`'s credentials.
    async fn list_page(
        &self,
        client: &AmazonS3,
        (bucket, bucket_url): (&str, &reqwest::Url),
        prefix: &str,
        page_token: Option<String>,
    ) -> Result<ListPage, ObjectError> {
        let failed = |e: String| ObjectError::Io(format!("listing `{}`: {e}", quote(prefix)));
        let mut url = bucket_url.clone();
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("list-type", "2");
            if !prefix.is_empty() {
                query.append_pair("prefix", prefix);
            }
            if let Some(token) = &page_token {
                query.append_pair("continuation-token", token);
            }
        }
        let credential = client
            .credentials()
            .get_credential()
            .await
            .map_err(|e| failed(format!("credentials: {e}")))?;
        let mut request = axum::http::Request::builder()
            .method(axum::http::Method::GET)
            .uri(url.as_str())
            .body(HttpRequestBody::from(bytes::Bytes::new()))
            .map_err(|e| failed(e.to_string()))?;
        AwsAuthorizer::new(&credential, "s3", &self.settings.region)
            .try_authorize(&mut request, None)
            .map_err(|e| failed(format!("signing: {e}")))?;
        let mut response = self
            .http
            .get(url)
            .headers(request.headers().clone())
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| failed(e.to_string()))? {
            if body.len() + chunk.len() > MAX_LIST_PAGE {
                return Err(failed(format!("a page of more than {MAX_LIST_PAGE} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(ObjectError::NotFound(quote(bucket)));
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            return Err(failed(format!("{status}: {text}")));
        }
        quick_xml::de::from_reader(body.as_slice()).map_err(|e| failed(format!("its answer: {e}")))
    }

    fn path(key: &str) -> Result<Path, ObjectError> {
        Path::parse(key).map_err(|e| ObjectError::Denied(format!("`{}`: {e}", quote(key))))
    }

    pub async fn head(&self, bucket: &str, key: &str) -> Result<ObjectMeta, ObjectError> {
        let (client, path) = (self.client(bucket)?, Self::path(key)?);
        let m = client.head(&path).await.map_err(|e| map(key, e))?;
        Ok(ObjectMeta {
            key: key.to_string(),
            ..meta(m)
        })
    }

    /// Bytes of an object, for `tenant` (whose share of the filer lookups a local read uses).
    pub async fn read(
        &self,
        tenant: &str,
        bucket: &str,
        key: &str,
        offset: u64,
        length: u64,
    ) -> Result<Vec<u8>, ObjectError> {
        let Some(end) = offset.checked_add(length).filter(|_| length > 0) else {
            return Ok(Vec::new());
        };
        let (client, path) = (self.client(bucket)?, Self::path(key)?);
        if let Some(near) = &self.locality
            && let Some(bytes) = near.read(tenant, bucket, key, offset, length).await
        {
            return Ok(bytes);
        }
        match client.get_range(&path, offset..end).await {
            Ok(bytes) => {
                // A store that sends more than was asked for is cut to what was charged.
                let n = bytes
                    .len()
                    .min(usize::try_from(length).unwrap_or(usize::MAX));
                // Without a second copy: the buffer object_store filled is the one returned
                // when nothing else holds it (it copies otherwise).
                let mut bytes = Vec::from(bytes);
                bytes.truncate(n);
                Ok(bytes)
            }
            Err(e) => Err(map(key, e)),
        }
    }

    pub async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        limit: usize,
        max_visits: usize,
        keep: Arc<dyn Fn(&str) -> bool + Send + Sync>,
        account: Option<&Arc<Account>>,
    ) -> Result<Vec<ObjectMeta>, ObjectError> {
        let (client, bucket_url) = (self.client(bucket)?, self.bucket_url(bucket)?);
        // The keys that start with the prefix as written, a page at a time. Listed as a
        // directory (what `ObjectStore::list` takes), `train/n014` walked every object under
        // `train/`, where the local store walks only the entries that match: a prefix ending
        // partway through a name under a large directory was refused as too many entries on
        // S3 and answered on the local store, and made the filer enumerate the whole
        // directory for a few keys. Read here rather than by object_store, which parses every
        // key of a page and failed the whole page, every listing over it, for one key it
        // cannot parse (a control character, a `.` segment: legal S3 keys).
        let mut kept = Smallest::new(limit, account);
        let mut visits = 0usize;
        let (mut page_token, mut last_token) = (None, None);
        loop {
            let page = self
                .list_page(&client, (bucket, &bucket_url), prefix, page_token.take())
                .await?;
            for listed in page.contents {
                visits += 1;
                if visits > max_visits {
                    return Err(ObjectError::TooManyEntries(max_visits as u64));
                }
                // A key this store cannot read is not listed, as the local store lists no
                // name it cannot serve.
                let k = listed.key.as_str();
                if Path::parse(k).is_err() || !k.starts_with(prefix) || !keep(k) {
                    continue;
                }
                let last_modified_ms = chrono::DateTime::parse_from_rfc3339(&listed.last_modified)
                    .map_or(0, |t| t.timestamp_millis().max(0) as u64);
                kept.push(ObjectMeta {
                    key: listed.key,
                    size: listed.size,
                    last_modified_ms,
                    etag: listed.e_tag,
                })?;
            }
            if !page.is_truncated {
                break;
            }
            // A truncated page names where the next begins, somewhere new: a store that does
            // not would end the listing short, or go round until the deadline.
            match page.next_continuation_token {
                Some(next) if last_token.as_ref() != Some(&next) => {
                    last_token = Some(next.clone());
                    page_token = Some(next);
                }
                _ => {
                    return Err(ObjectError::Io(format!(
                        "listing `{}`: the store gave a truncated page without a new \
                         continuation token",
                        quote(prefix)
                    )));
                }
            }
        }
        Ok(kept.into_sorted())
    }
}
