//! `GET /v1/placement` and `POST /v1/placement`: where this host's local volume server keeps
//! objects, so that a trainer can send each key to the host beside a replica
//! ([`crate::store::locality`]). Both need a tenant's token; the keys asked about must be
//! within the tenant's grants, as if it read them.

use crate::Host;
use crate::account::text::quote;
use crate::http::errors::ApiError;
use crate::http::extract::{self, Authed};
use crate::store::keys::check_key;
use crate::store::locality::MAX_PLACEMENT_KEYS;
use crate::store::scoped::granted;
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use hapi_wire::ErrorCode;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Largest placement request body: the keys' bound at their longest, and some.
const MAX_BODY: usize = 2 << 20;

fn not_set_up() -> ApiError {
    ApiError::new(
        ErrorCode::NoRoute,
        "this host reads through S3 only (no host.s3.local_volume_server in its policy)",
    )
}

/// The volumes this host's volume server holds: what a trainer needs to send keys here. Not
/// the server's address, nor the node's read counters (every tenant's reads: the operator's
/// `/metrics` has them).
#[derive(Debug, Serialize)]
pub struct Held {
    volumes: Vec<u32>,
}

pub async fn report(
    State(host): State<Arc<Host>>,
    Authed(_tenant): Authed,
) -> Result<Json<Held>, ApiError> {
    let near = host.runtime().objects().locality().ok_or_else(not_set_up)?;
    Ok(Json(Held {
        volumes: near.report().await.volumes,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ask {
    bucket: String,
    keys: Keys,
}

/// The keys asked about: the first [`MAX_PLACEMENT_KEYS`] kept, the rest only counted while
/// parsed, so that a body of tiny keys does not become an allocation for each before the
/// count is checked.
#[derive(Debug)]
struct Keys {
    kept: Vec<String>,
    total: usize,
}

impl<'de> Deserialize<'de> for Keys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Counting;
        impl<'de> serde::de::Visitor<'de> for Counting {
            type Value = Keys;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of keys")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Keys, A::Error> {
                let mut keys = Keys {
                    kept: Vec::new(),
                    total: 0,
                };
                while keys.kept.len() < MAX_PLACEMENT_KEYS {
                    match seq.next_element::<String>()? {
                        Some(k) => keys.kept.push(k),
                        None => break,
                    }
                }
                keys.total = keys.kept.len();
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    keys.total += 1;
                }
                Ok(keys)
            }
        }
        d.deserialize_seq(Counting)
    }
}

#[derive(Debug, Serialize)]
pub struct Answer {
    /// Per key, in order: the volumes its chunks are on (empty: unknown here).
    volumes: Vec<Vec<u32>>,
}

/// Each key's volumes, as the filer tells them. A request refused (busy, a bad body, keys
/// outside the grants) is counted in `hapi_refused_total` under endpoint `placement`.
pub async fn lookup(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Answer>, ApiError> {
    let refused = ApiError::counted(&host.metrics, &tenant.name, "placement");
    look_up(&host, &tenant, &headers, body)
        .await
        .map_err(refused)
}

async fn look_up(
    host: &Arc<Host>,
    tenant: &Arc<crate::policy::Tenant>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Json<Answer>, ApiError> {
    let near = host.runtime().objects().locality().ok_or_else(not_set_up)?;
    let declared = extract::declared_within(headers, MAX_BODY)?;
    let timeout = host.policy().host.http.body_timeout;
    // A body is read under one of the tenant's slots, as an invocation's is: a tenant holds
    // at most `concurrency` request bodies of any kind, however many connections it opens.
    let Some(_slot) = host.admission(tenant).admit().await else {
        return extract::refuse(body, MAX_BODY, timeout, ApiError::busy(tenant)).await;
    };
    let bytes = extract::body(body, declared, MAX_BODY, timeout).await?;
    // Its grants as they are now: a reload may have come while it waited.
    let tenant = extract::still(host, tenant)?;
    // No string past a key's longest, escaped, before serde (whose errors quote them whole).
    hapi_wire::invoke::check_strings(&bytes, 6 * hapi_wire::invoke::MAX_KEY_BYTES)
        .map_err(|e| ApiError::new(ErrorCode::BadJson, format!("placement request: {e}")))?;
    let ask: Ask = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::new(ErrorCode::BadJson, format!("placement request: {e}")))?;
    if ask.keys.total > MAX_PLACEMENT_KEYS {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "{} keys: at most {MAX_PLACEMENT_KEYS} per placement request",
                ask.keys.total
            ),
        ));
    }
    for key in &ask.keys.kept {
        check_key(key).map_err(|e| ApiError::new(ErrorCode::BadRequest, e))?;
        if !granted(&tenant, &ask.bucket, key, false) {
            return Err(ApiError::new(
                ErrorCode::ObjectDenied,
                format!(
                    "`{}/{}` is outside your grants",
                    quote(&ask.bucket),
                    quote(key)
                ),
            ));
        }
    }
    // Within the tenant's time limit, as an invocation: against a slow filer, 1,024 lookups
    // eight at a time held the tenant's slot and its share of the lookups for many minutes. At
    // the limit it answers what it found; the other keys have no volumes.
    let deadline = crate::account::Deadline::new(tenant.limits.timeout);
    let volumes = near
        .placement(&tenant.name, &ask.bucket, &ask.keys.kept, &deadline)
        .await;
    Ok(Json(Answer { volumes }))
}
