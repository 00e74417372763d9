//! An S3 service, through `object_store`, one client per bucket.

use super::error::{Held, ObjectError, ObjectMeta, Smallest};
use crate::account::Account;
use crate::account::text::quote;
use crate::locks::lock;
use crate::policy::S3Settings;
use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer};
use object_store::client::HttpRequestBody;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most bytes of one listing page read (S3 sends at most 1,000 keys of at most 1 KiB a page,
/// about 1.5 MB of XML).
const MAX_LIST_PAGE: usize = 16 << 20;

/// How often a listing's page is asked for when the store answers that it is busy or failed
/// (5xx, 429) or the connection failed, and the wait before the first retry (doubled at each).
const LIST_TRIES: u32 = 4;
const LIST_RETRY_WAIT: Duration = Duration::from_millis(100);

/// Most truncated pages in a row without an entry a listing asks for: a store that answers
/// with empty pages, each naming a new place to go on from, would otherwise be asked again
/// until the caller's deadline.
const MAX_EMPTY_PAGES: usize = 64;

/// Most XML events a page's parser holds while it looks past other elements for more
/// `<Contents>` (S3 sends about a dozen elements beside them, three events each).
const MAX_PAGE_LOOKAHEAD: usize = 1024;

/// What a listing's page is charged as while the host reads and parses it.
const LISTING_PAGE: &str = "a listing's page, held by the host";

pub struct S3 {
    settings: S3Settings,
    buckets: Mutex<HashMap<String, Arc<Bucket>>>,
    /// The listings' client (object_store's time limits: 5 s to connect, 30 s a request).
    http: reqwest::Client,
    locality: Option<super::locality::Locality>,
}

/// One bucket's clients: object_store's, for reads, and where its listings go, as
/// object_store addresses the bucket (the same endpoint, whether set by the policy or by
/// object_store's `AWS_*` environment, and the same signing).
struct Bucket {
    client: Arc<AmazonS3>,
    /// The bucket's path-style URL.
    url: reqwest::Url,
    /// Whether requests are signed (not with object_store's `skip_signature`).
    signed: bool,
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
    /// `url` when the keys are URL-encoded, as asked (a store that ignores the ask sends
    /// them as they are, and none).
    encoding_type: Option<String>,
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
            buckets: Mutex::default(),
            // A redirect is an error, not followed: the listing is the endpoint's, signed for it.
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(30))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
        }
    }

    /// Reading replicas from the local volume server, when the policy sets it up.
    pub fn locality(&self) -> Option<&super::locality::Locality> {
        self.locality.as_ref()
    }

    fn bucket(&self, bucket: &str) -> Result<Arc<Bucket>, ObjectError> {
        let mut buckets = lock(&self.buckets);
        if let Some(b) = buckets.get(bucket) {
            return Ok(Arc::clone(b));
        }
        let s = &self.settings;
        let mut b = AmazonS3Builder::from_env()
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
        let failed = |e: String| ObjectError::Io(format!("bucket `{}`: {e}", quote(bucket)));
        let (url, signed) = Self::listing_address(&b, bucket).map_err(failed)?;
        let client = Arc::new(b.build().map_err(|e| failed(e.to_string()))?);
        let b = Arc::new(Bucket {
            client,
            url,
            signed,
        });
        buckets.insert(bucket.to_string(), Arc::clone(&b));
        Ok(b)
    }

    fn client(&self, bucket: &str) -> Result<Arc<AmazonS3>, ObjectError> {
        Ok(Arc::clone(&self.bucket(bucket)?.client))
    }

    /// Where `b`'s client sends a request about `bucket` (path-style, which the host asks
    /// for), and whether it signs it: the endpoint object_store takes (the S3 one before the
    /// generic one, from the policy or the environment), else AWS's for the region.
    fn listing_address(b: &AmazonS3Builder, bucket: &str) -> Result<(reqwest::Url, bool), String> {
        let endpoint = b
            .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
            .or_else(|| b.get_config_value(&AmazonS3ConfigKey::Endpoint))
            .unwrap_or_else(|| {
                let region = b.get_config_value(&AmazonS3ConfigKey::Region);
                format!("https://s3.{}.amazonaws.com", region.unwrap_or_default())
            });
        let mut url = reqwest::Url::parse(endpoint.trim_end_matches('/'))
            .map_err(|e| format!("{endpoint}: {e}"))?;
        url.path_segments_mut()
            .map_err(|()| format!("{endpoint}: not a base URL"))?
            .pop_if_empty()
            .push(bucket);
        let unsigned = b
            .get_config_value(&AmazonS3ConfigKey::SkipSignature)
            .is_some_and(|v| {
                matches!(
                    v.to_ascii_lowercase().as_str(),
                    "1" | "true" | "on" | "yes" | "y"
                )
            });
        Ok((url, !unsigned))
    }

    /// One page of `ListObjectsV2` of `prefix` in `bucket`, read and parsed while charged
    /// (the charge is returned with the page, for as long as it is held), asked again while
    /// the store answers that it is busy or failed.
    async fn list_page(
        &self,
        bucket: (&str, &Bucket),
        prefix: &str,
        page_token: Option<&str>,
        account: Option<&Arc<Account>>,
    ) -> Result<(ListPage, Held), ObjectError> {
        let mut wait = LIST_RETRY_WAIT;
        for tries_left in (0..LIST_TRIES).rev() {
            match self
                .try_list_page(bucket, prefix, page_token, account)
                .await
            {
                Err(Try::Again(_)) if tries_left > 0 => {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(Try::Again(e) | Try::Failed(e)) => return Err(e),
                Ok(page) => return Ok(page),
            }
        }
        unreachable!("the last try returns")
    }

    /// One request of [`S3::list_page`].
    async fn try_list_page(
        &self,
        (bucket, b): (&str, &Bucket),
        prefix: &str,
        page_token: Option<&str>,
        account: Option<&Arc<Account>>,
    ) -> Result<(ListPage, Held), Try> {
        let failed = |e: String| ObjectError::Io(format!("listing `{}`: {e}", quote(prefix)));
        let mut url = b.url.clone();
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("list-type", "2");
            // Keys as they are: XML cannot carry every character a key may hold, and its
            // parser drops a key's leading and trailing spaces.
            query.append_pair("encoding-type", "url");
            if !prefix.is_empty() {
                query.append_pair("prefix", prefix);
            }
            if let Some(token) = page_token {
                query.append_pair("continuation-token", token);
            }
        }
        let mut request = self.http.get(url.clone());
        if b.signed {
            let credential = b
                .client
                .credentials()
                .get_credential()
                .await
                .map_err(|e| Try::Failed(failed(format!("credentials: {e}"))))?;
            let mut signed = axum::http::Request::builder()
                .method(axum::http::Method::GET)
                .uri(url.as_str())
                .body(HttpRequestBody::from(bytes::Bytes::new()))
                .map_err(|e| Try::Failed(failed(e.to_string())))?;
            AwsAuthorizer::new(&credential, "s3", &self.settings.region)
                .try_authorize(&mut signed, None)
                .map_err(|e| Try::Failed(failed(format!("signing: {e}"))))?;
            request = request.headers(signed.headers().clone());
        }
        // A connection that fails, or a store that is busy or failed, is asked again.
        let mut response = request
            .send()
            .await
            .map_err(|e| Try::Again(failed(e.to_string())))?;
        let status = response.status();
        let mut held = Held::new(account, LISTING_PAGE);
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| Try::Again(failed(e.to_string())))?
        {
            if body.len() + chunk.len() > MAX_LIST_PAGE {
                return Err(Try::Failed(failed(format!(
                    "a page of more than {MAX_LIST_PAGE} bytes"
                ))));
            }
            gather(&mut body, &chunk, &mut held).map_err(Try::Failed)?;
        }
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(Try::Failed(ObjectError::NotFound(quote(bucket))));
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            let e = failed(format!("{status}: {text}"));
            let again =
                status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
            return Err(if again { Try::Again(e) } else { Try::Failed(e) });
        }
        // The parsed page holds at most what its XML does, beside it until the XML goes.
        held.grow(body.len() as u64).map_err(Try::Failed)?;
        // With `overlapped-lists` (object_store turns it on) the parser copies every element
        // after the first `<Contents>` into a queue while it looks for more, unbounded, each
        // tag an owned event of some 40 bytes and an allocation: a 16 MiB page of `<a/>`s
        // would queue 8 million (reckoned from quick-xml's code, not measured). S3 sends a
        // dozen elements beside its `<Contents>`; a page with more is refused.
        let mut parser = quick_xml::de::Deserializer::from_reader(body.as_slice());
        parser.event_buffer_size(std::num::NonZeroUsize::new(MAX_PAGE_LOOKAHEAD));
        let page = <ListPage as serde::Deserialize>::deserialize(&mut parser)
            .map_err(|e| Try::Failed(failed(format!("its answer: {e}"))))?;
        drop(parser);
        let read = body.capacity() as u64;
        drop(body);
        held.shrink(read);
        Ok((page, held))
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
        let options = object_store::GetOptions::new().with_range(Some(offset..end));
        let got = client
            .get_opts(&path, options)
            .await
            .map_err(|e| map(key, e))?;
        // What was asked for, at most: a store that sends more (a body longer than its
        // Content-Range says) is cut there and its connection closed, not read to its end
        // into a buffer that grows with it.
        let length = usize::try_from(length).unwrap_or(usize::MAX);
        let mut stream = got.into_stream();
        let mut bytes: Vec<u8> = Vec::new();
        while bytes.len() < length
            && let Some(chunk) = stream.next().await
        {
            let chunk = chunk.map_err(|e| map(key, e))?;
            if bytes.is_empty() && chunk.len() == length {
                // The whole range in one piece: no second copy when nothing else holds it.
                return Ok(Vec::from(chunk));
            }
            if bytes.is_empty() {
                // The caller charged `length`.
                bytes.reserve_exact(length);
            }
            let take = chunk.len().min(length - bytes.len());
            bytes.extend_from_slice(&chunk[..take]);
        }
        Ok(bytes)
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
        let b = self.bucket(bucket)?;
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
        let mut page_token: Option<String> = None;
        let mut empty_pages = 0usize;
        loop {
            let (page, _page_held) = self
                .list_page((bucket, &b), prefix, page_token.as_deref(), account)
                .await?;
            let encoded = page.encoding_type.as_deref() == Some("url");
            empty_pages = if page.contents.is_empty() {
                empty_pages + 1
            } else {
                0
            };
            for listed in page.contents {
                visits += 1;
                if visits > max_visits {
                    return Err(ObjectError::TooManyEntries(max_visits as u64));
                }
                // A key this store cannot read is not listed, as the local store lists no
                // name it cannot serve.
                let Some(key) = (if encoded {
                    url_decoded(&listed.key)
                } else {
                    Some(listed.key)
                }) else {
                    continue;
                };
                if Path::parse(&key).is_err() || !key.starts_with(prefix) || !keep(&key) {
                    continue;
                }
                let last_modified_ms = chrono::DateTime::parse_from_rfc3339(&listed.last_modified)
                    .map_or(0, |t| t.timestamp_millis().max(0) as u64);
                kept.push(ObjectMeta {
                    key,
                    size: listed.size,
                    last_modified_ms,
                    etag: listed.e_tag,
                })?;
            }
            if !page.is_truncated {
                break;
            }
            if empty_pages >= MAX_EMPTY_PAGES {
                return Err(ObjectError::Io(format!(
                    "listing `{}`: the store gave {empty_pages} truncated pages in a row \
                     without an entry",
                    quote(prefix)
                )));
            }
            // A truncated page names where the next begins, somewhere new: a store that does
            // not would end the listing short, or go round until the deadline.
            match page.next_continuation_token {
                Some(next) if page_token.as_ref() != Some(&next) => page_token = Some(next),
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

/// How a request of a listing failed: worth asking again (the connection, or a store that is
/// busy or failed), or not.
enum Try {
    Again(ObjectError),
    Failed(ObjectError),
}

/// A key as S3 sends it with `encoding-type=url` (`+` for a space, `%XX` for a byte), or
/// `None` if that does not give UTF-8.
/// Appends `chunk` to `body`, a listing page at most [`MAX_LIST_PAGE`] long, charging `held`
/// for what the buffer holds rather than for the bytes it was given: growing, it holds its old
/// bytes and the new ones at once, then twice what it was given at most (a page read to 9 MiB
/// held some 24 MiB while 9 were charged).
fn gather(body: &mut Vec<u8>, chunk: &[u8], held: &mut Held) -> Result<(), ObjectError> {
    let need = body.len() + chunk.len();
    if need > body.capacity() {
        let (old, len) = (body.capacity(), body.len());
        let cap = need.max(old.saturating_mul(2)).min(MAX_LIST_PAGE.max(need));
        held.regrow(1, (old, cap), || {
            body.reserve_exact(cap - len);
            body.capacity()
        })?;
    }
    body.extend_from_slice(chunk);
    Ok(())
}

fn url_decoded(key: &str) -> Option<String> {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let (mut bytes, mut rest) = (Vec::with_capacity(key.len()), key.as_bytes());
    while let Some((&c, tail)) = rest.split_first() {
        rest = tail;
        bytes.push(match c {
            b'+' => b' ',
            b'%' => {
                let [h, l, tail @ ..] = rest else {
                    return None;
                };
                rest = tail;
                hex(*h)? << 4 | hex(*l)?
            }
            c => c,
        });
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_url_decoded_as_s3_encodes_them() {
        assert_eq!(url_decoded("p/a+b%2Bc%25d+").as_deref(), Some("p/a b+c%d "));
        assert_eq!(
            url_decoded("%E2%82%AC%7F").as_deref(),
            Some("\u{20ac}\u{7f}")
        );
        assert_eq!(
            url_decoded("plain/key.bin").as_deref(),
            Some("plain/key.bin")
        );
        // Cut short, not hex, or not UTF-8: not a key the host can serve.
        assert_eq!(url_decoded("a%2"), None);
        assert_eq!(url_decoded("a%zz"), None);
        assert_eq!(url_decoded("a%FF"), None);
    }

    /// A store on a socket that answers its requests in turn with `answers` (status, body),
    /// the last one again after them; its endpoint and a count of the requests it was sent.
    async fn store(answers: Vec<(u16, String)>) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        let asked = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&asked);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && socket.read(&mut byte).await.unwrap_or(0) == 1
                {
                    head.push(byte[0]);
                }
                let n = count.fetch_add(1, Ordering::SeqCst);
                let (status, body) = &answers[n.min(answers.len() - 1)];
                // `{n}` in a body is the request's number (a new continuation token each time).
                let body = body.replace("{n}", &n.to_string());
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        (endpoint, asked)
    }

    fn s3(endpoint: String) -> S3 {
        S3::new(S3Settings {
            endpoint,
            region: "us-east-1".into(),
            access_key_id: Some("id".into()),
            secret_access_key: Some("secret".into()),
            locality: None,
        })
    }

    fn page(keys: &[&str]) -> String {
        let contents: String = keys
            .iter()
            .map(|k| {
                format!(
                    "<Contents><Key>{k}</Key><Size>1</Size>\
                     <LastModified>2026-12-06T12:00:00Z</LastModified></Contents>"
                )
            })
            .collect();
        format!(
            "<ListBucketResult><IsTruncated>false</IsTruncated>{contents}\
             <EncodingType>url</EncodingType></ListBucketResult>"
        )
    }

    async fn list(s3: &S3, account: Option<&Arc<Account>>) -> Result<Vec<String>, ObjectError> {
        let all: Arc<dyn Fn(&str) -> bool + Send + Sync> = Arc::new(|_: &str| true);
        let listed = s3.list("b", "p/", 100, 1000, all, account).await?;
        Ok(listed.into_iter().map(|m| m.key).collect())
    }

    #[tokio::test]
    async fn a_listing_asks_again_while_the_store_is_busy_and_not_when_it_refuses() {
        use std::sync::atomic::Ordering;
        let busy = (503, "<Error><Code>SlowDown</Code></Error>".to_string());
        let good = (200, page(&["p/a+b%2B", "p/%C3%A9+"]));
        let (endpoint, asked) = store(vec![busy.clone(), busy.clone(), good]).await;
        assert_eq!(
            list(&s3(endpoint), None).await,
            Ok(vec!["p/a b+".to_string(), "p/\u{e9} ".to_string()])
        );
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        // Busy at every try: the last answer, after LIST_TRIES.
        let (endpoint, asked) = store(vec![busy]).await;
        let e = list(&s3(endpoint), None).await;
        assert!(
            matches!(&e, Err(ObjectError::Io(m)) if m.contains("503")),
            "{e:?}"
        );
        assert_eq!(asked.load(Ordering::SeqCst), LIST_TRIES as usize);
        // A refusal is the answer.
        let (endpoint, asked) = store(vec![(403, "<Error/>".into())]).await;
        assert!(matches!(
            list(&s3(endpoint), None).await,
            Err(ObjectError::Io(_))
        ));
        assert_eq!(asked.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_store_answering_empty_truncated_pages_is_not_asked_without_end() {
        use std::sync::atomic::Ordering;
        // Each page empty, truncated, and naming a new token.
        let empty = "<ListBucketResult><IsTruncated>true</IsTruncated>\
                     <NextContinuationToken>t{n}</NextContinuationToken>\
                     <EncodingType>url</EncodingType></ListBucketResult>";
        let (endpoint, asked) = store(vec![(200, empty.to_string())]).await;
        // Asked again without end before (a bound here for the test's sake).
        let e = tokio::time::timeout(Duration::from_secs(30), list(&s3(endpoint), None))
            .await
            .expect("the listing ends");
        assert!(
            matches!(&e, Err(ObjectError::Io(m)) if m.contains("truncated pages in a row")),
            "{e:?}"
        );
        assert_eq!(asked.load(Ordering::SeqCst), MAX_EMPTY_PAGES);
        // Empty pages between pages with entries are followed: only a run of them ends it.
        let mut answers = vec![(200, empty.to_string()); MAX_EMPTY_PAGES - 1];
        answers.push((
            200,
            page(&["p/a"]).replace(
                "<IsTruncated>false</IsTruncated>",
                "<IsTruncated>true</IsTruncated><NextContinuationToken>t{n}</NextContinuationToken>",
            ),
        ));
        answers.extend(vec![(200, empty.to_string()); MAX_EMPTY_PAGES - 1]);
        answers.push((200, page(&["p/b"])));
        let (endpoint, asked) = store(answers).await;
        assert_eq!(
            list(&s3(endpoint), None).await,
            Ok(vec!["p/a".to_string(), "p/b".to_string()])
        );
        assert_eq!(asked.load(Ordering::SeqCst), 2 * MAX_EMPTY_PAGES);
    }

    #[tokio::test]
    async fn a_page_the_parser_would_queue_much_of_is_refused() {
        // One entry, then 100,000 elements the parser passes on its way to more entries.
        let many = format!(
            "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/a</Key>\
             <Size>1</Size><LastModified>2026-12-06T12:00:00Z</LastModified></Contents>\
             <Z>{}</Z></ListBucketResult>",
            "<a/>".repeat(100_000)
        );
        let (endpoint, _) = store(vec![(200, many)]).await;
        let e = list(&s3(endpoint), None).await;
        assert!(
            matches!(&e, Err(ObjectError::Io(m)) if m.contains("events")),
            "{e:?}"
        );
    }

    /// A store that answers a ranged GET of 10 bytes with a body of 256 MiB, and the bytes
    /// it got to write before its reader closed the connection.
    async fn a_store_that_sends_too_much() -> (String, tokio::task::JoinHandle<usize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        let sent = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && socket.read(&mut byte).await.unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let total = 256usize << 20;
            let answer = format!(
                "HTTP/1.1 206 Partial Content\r\ncontent-range: bytes 0-9/10\r\n\
                 content-length: {total}\r\netag: \"e\"\r\n\
                 last-modified: Sun, 06 Dec 2026 12:00:00 GMT\r\n\r\n"
            );
            socket.write_all(answer.as_bytes()).await.expect("head");
            let chunk = vec![b'x'; 1 << 20];
            let mut sent = 0;
            while sent < total && socket.write_all(&chunk).await.is_ok() {
                sent += chunk.len();
            }
            sent
        });
        (endpoint, sent)
    }

    #[tokio::test]
    async fn a_read_takes_what_was_asked_for_and_closes_on_the_rest() {
        let (endpoint, sent) = a_store_that_sends_too_much().await;
        let s3 = s3(endpoint);
        assert_eq!(s3.read("t", "b", "p/a", 0, 10).await, Ok(vec![b'x'; 10]));
        drop(s3);
        // The rest was not read (before: all 256 MiB, into one growing buffer).
        let sent = tokio::time::timeout(Duration::from_secs(20), sent)
            .await
            .expect("the store stops writing")
            .expect("store");
        assert!(sent < 64 << 20, "the store wrote {sent} bytes");
    }

    #[test]
    fn a_pages_buffer_is_charged_for_what_it_holds_as_it_grows() {
        let account = Account::new(1 << 30);
        let mut held = Held::new(Some(&account), LISTING_PAGE);
        let mut body = Vec::new();
        let mut peak = 0;
        for (i, size) in [16 << 10, 9 << 10, 100 << 10, 3 << 20, 5 << 20, 1]
            .into_iter()
            .enumerate()
        {
            let old = body.capacity();
            gather(&mut body, &vec![i as u8; size], &mut held).expect("room");
            assert!(
                account.used() >= body.capacity() as u64,
                "charged past its bytes"
            );
            // Reallocated: both buffers were held at once.
            if body.capacity() != old {
                peak = peak.max(old + body.capacity());
            }
        }
        assert_eq!(
            body.len(),
            (16 << 10) + (9 << 10) + (100 << 10) + (8 << 20) + 1
        );
        assert!(account.peak() >= peak as u64, "{} < {peak}", account.peak());
        drop(held);
        assert_eq!(account.used(), 0);
    }

    #[tokio::test]
    async fn a_listings_page_is_charged_while_it_is_held() {
        let keys: Vec<String> = (0..200).map(|i| format!("p/{i:0100}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let body = page(&keys);
        let (endpoint, _) = store(vec![(200, body.clone())]).await;
        let s3 = s3(endpoint);
        // The entries kept (100 of 104 bytes' guest size) fit; the page beside them does not.
        let kept = 100 * (102 + 40);
        let small = Account::new(kept + body.len() as u64);
        let e = list(&s3, Some(&small)).await;
        assert!(matches!(e, Err(ObjectError::OverLimit(_))), "{e:?}");
        assert_eq!(small.used(), 0, "released with the listing");
        let room = Account::new(kept + 3 * body.len() as u64);
        assert_eq!(list(&s3, Some(&room)).await.map(|k| k.len()), Ok(100));
        assert!(room.peak() >= 2 * body.len() as u64, "peak {}", room.peak());
        assert_eq!(room.used(), 0);
    }
}
