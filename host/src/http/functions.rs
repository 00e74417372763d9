//! `PUT /v1/functions/{name}`, `DELETE /v1/functions/{name}`, `GET /v1/functions`: a tenant's
//! own components.

use crate::Host;
use crate::functions::Function;
use crate::http::errors::ApiError;
use crate::http::extract::{self, Authed, Name};
use crate::policy::Tenant;
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use hapi_wire::ErrorCode;
use serde::Serialize;
use std::sync::Arc;

#[derive(Serialize)]
struct FunctionInfo {
    name: String,
    sha256: String,
    size: usize,
    /// Bytes of its compiled code, which count against the tenant's quota beside `size`
    /// (once for functions with the same bytes).
    compiled_size: u64,
    /// Deployed by the operator's policy (cannot be replaced or removed through the API).
    managed: bool,
}

fn info(f: &Function) -> FunctionInfo {
    FunctionInfo {
        name: f.name.clone(),
        sha256: f.sha256.clone(),
        size: f.size,
        compiled_size: f.code_size,
        managed: f.managed,
    }
}

fn require_deploy(tenant: &Tenant) -> Result<(), ApiError> {
    if tenant.deploy {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::DeployNotAllowed,
            format!("tenant `{}` may not deploy functions", tenant.name),
        ))
    }
}

pub async fn list(State(host): State<Arc<Host>>, Authed(tenant): Authed) -> impl IntoResponse {
    let list: Vec<FunctionInfo> = host
        .functions(&tenant.name)
        .iter()
        .map(|f| info(f))
        .collect();
    Json(list)
}

pub async fn deploy(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
    Name(name): Name,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let refused = ApiError::counted(&host.metrics, &tenant.name, "deploy");
    require_deploy(&tenant).map_err(refused)?;
    let http = host.policy().host.http.clone();
    // Nothing larger than the request limit or the tenant's whole quota is read.
    let limit = http
        .max_request
        .min(usize::try_from(tenant.limits.max_function_bytes).unwrap_or(usize::MAX));
    let declared = extract::declared_within(&headers, limit).map_err(refused)?;
    // The tenant's one upload in progress, taken before a byte of it is read: a tenant holds at
    // most one upload's bytes at once however many connections it opens.
    let reservation = match host.reserve_deploy(&tenant, &name, declared.unwrap_or(0)) {
        Ok(r) => r,
        Err(e) => {
            return extract::refuse(body, limit, http.body_timeout, e.into())
                .await
                .map_err(refused);
        }
    };
    let bytes = extract::body(body, declared, limit, http.body_timeout)
        .await
        .map_err(refused)?;
    let f = host.deploy(&tenant, reservation, bytes).await?;
    Ok((StatusCode::CREATED, Json(info(&f))))
}

pub async fn undeploy(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
    Name(name): Name,
) -> Result<StatusCode, ApiError> {
    let metrics = Arc::clone(&host.metrics);
    let refused = ApiError::counted(&metrics, &tenant.name, "undeploy");
    require_deploy(&tenant).map_err(refused)?;
    // It waits for a policy reload in progress, which may compile, on a blocking thread: a
    // few at a time, so that a flood of removals cannot take the blocking pool's threads.
    let turn = Arc::clone(&host.undeploys)
        .acquire_owned()
        .await
        .map_err(|e| ApiError::fault(format!("undeploy turn: {e}")))?;
    let (h, t) = (Arc::clone(&host), Arc::clone(&tenant));
    tokio::task::spawn_blocking(move || {
        // Held by the job: it runs on if its client hangs up.
        let _turn = turn;
        h.undeploy(&t, &name)
    })
    .await
    .map_err(|e| ApiError::fault(format!("undeploy worker: {e}")))?
    .map_err(|e| refused(e.into()))?;
    Ok(StatusCode::NO_CONTENT)
}
