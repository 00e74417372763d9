//! Sizes and durations as operators write them: [`hapi_wire::units`], shared with the trainer.

pub use hapi_wire::units::*;
