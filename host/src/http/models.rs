//! `GET /v1/models`, `GET /v1/models/{name}/profile`: the tenant's models, and their per-layer
//! time, output size and memory on this host's device.

use crate::Host;
use crate::http::errors::ApiError;
use crate::http::extract::{self, Authed, Name};
use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use hapi_wire::ErrorCode;
use serde::Serialize;
use std::sync::Arc;

#[derive(Serialize)]
struct ModelInfo<'a> {
    name: &'a str,
    display_name: &'a str,
    weights: &'a str,
    layers: usize,
    freeze_index: usize,
    input: &'a hapi_model::InputSpec,
    output_bytes_per_sample: Vec<u64>,
}

pub async fn list(State(host): State<Arc<Host>>, Authed(tenant): Authed) -> impl IntoResponse {
    let models = host.runtime().models().visible(&tenant);
    let list: Vec<ModelInfo<'_>> = models
        .iter()
        .map(|(name, m)| ModelInfo {
            name,
            display_name: &m.display_name,
            weights: &m.weights,
            layers: m.layers.len(),
            freeze_index: m.freeze_index,
            input: &m.input,
            output_bytes_per_sample: m
                .layers
                .iter()
                .map(hapi_model::Layer::output_bytes_per_sample)
                .collect(),
        })
        .collect();
    Json(serde_json::to_value(list).unwrap_or_default())
}

pub async fn profile(
    State(host): State<Arc<Host>>,
    Authed(tenant): Authed,
    Name(name): Name,
) -> Result<impl IntoResponse, ApiError> {
    let refused = ApiError::counted(&host.metrics, &tenant.name, "profile");
    let Some(model) = host.runtime().models().resolve(&tenant, &name) else {
        return Err(refused(ApiError::new(
            ErrorCode::ModelNotFound,
            format!("no model `{name}` for tenant `{}`", tenant.name),
        )));
    };
    // A profile may load the model and run it: it takes one of the tenant's slots, as an
    // invocation does, so that profiles cannot be called past the tenant's concurrency.
    let permit = host
        .admission(&tenant)
        .admit()
        .await
        .ok_or_else(|| refused(ApiError::busy(&tenant)))?;
    // Under the policy of now: a reload while it waited may have revoked the token or the
    // model's grant.
    let tenant = extract::still(&host, &tenant).map_err(refused)?;
    let Some(model) = host
        .runtime()
        .models()
        .resolve(&tenant, &name)
        .filter(|now| now.id == model.id)
    else {
        return Err(refused(ApiError::new(
            ErrorCode::ModelNotFound,
            format!("no model `{name}` for tenant `{}`", tenant.name),
        )));
    };
    // The slot goes with the measurement, if one starts, not with this request.
    Ok(Json(
        host.profile(&tenant, &model.id, &name, Some(permit))
            .await?,
    ))
}
