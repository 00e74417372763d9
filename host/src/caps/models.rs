//! The `models` capability: what a model the tenant may use wants as input
//! (`hapi:pushdown/models`).

use crate::account::text::quote;
use crate::bindings::hapi::pushdown::models as wit;
use crate::caps::caller::{Caller, Stop};
use crate::models::Models;
use std::sync::Arc;
use wasmtime::component::{HasData, Linker};

#[derive(Debug)]
pub struct ModelsCtx {
    caller: Caller,
    models: Arc<Models>,
}

#[derive(Debug)]
pub struct ModelsCap;

impl HasData for ModelsCap {
    type Data<'a> = &'a mut ModelsCtx;
}

/// Adds `hapi:pushdown/models` to `linker`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> &mut ModelsCtx,
) -> wasmtime::Result<()> {
    wit::add_to_linker::<T, ModelsCap>(linker, get)
}

impl ModelsCtx {
    pub fn new(caller: Caller, models: Arc<Models>) -> Self {
        Self { caller, models }
    }
}

impl wit::Host for ModelsCtx {
    async fn describe(&mut self, name: String) -> wasmtime::Result<Result<wit::ModelInfo, String>> {
        let tenant = &self.caller.tenant_now().map_err(Stop::trap)?;
        let Some(m) = self.models.resolve(tenant, &name).map(|r| r.manifest) else {
            return Ok(Err(format!(
                "model `{}` is not one tenant `{}` may use",
                quote(&name),
                tenant.name
            )));
        };
        use hapi_preprocess::{ChannelOrder, Filter, Layout, ResizeMode};
        let t = m.input.transform();
        let info = wit::ModelInfo {
            name,
            layers: m.layers.len() as u32,
            freeze_index: m.freeze_index as u32,
            input: wit::InputSpec {
                // A loaded manifest's input shape is what its preprocessing makes (checked when
                // it is read): three channels of crop x crop, laid out as `layout` says.
                channels: 3,
                height: t.crop,
                width: t.crop,
                resize: t.resize,
                crop: t.crop,
                mean: t.mean.to_vec(),
                std: t.std.to_vec(),
                resize_mode: match t.resize_mode {
                    ResizeMode::Shorter => wit::ResizeMode::Shorter,
                    ResizeMode::Squash => wit::ResizeMode::Squash,
                },
                interpolation: match t.filter {
                    Filter::Bilinear => wit::Interpolation::Bilinear,
                    Filter::Bicubic => wit::Interpolation::Bicubic,
                },
                channel_order: match t.channel_order {
                    ChannelOrder::Rgb => wit::ChannelOrder::Rgb,
                    ChannelOrder::Bgr => wit::ChannelOrder::Bgr,
                },
                layout: match t.layout {
                    Layout::Nchw => wit::Layout::Nchw,
                    Layout::Nhwc => wit::Layout::Nhwc,
                },
                scale: t.scale.max(),
            },
        };
        let bytes =
            (info.name.len() + 4 * (info.input.mean.len() + info.input.std.len()) + 64) as u64;
        self.caller
            .account
            .check_incoming(bytes, "model description")
            .map_err(|e| Stop::from(e).trap())?;
        Ok(Ok(info))
    }
}
