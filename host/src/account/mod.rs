//! What an invocation is charged for: memory ([`Account`]), time ([`Deadline`], and [`Cancel`]
//! for the blocking work it leaves when it stops), the text it
//! makes the host keep ([`text`]), what it used ([`Usage`]: reads, device time), and its share of
//! the workers for the host's own work on its behalf on other threads ([`Pace`]), and where its
//! large buffers are freed ([`Reaper`]).
//!
//! Every byte the host holds on an invocation's behalf is charged to its account before it is
//! allocated and released when it is dropped; every wait in a host call ends at its deadline.
//! These are the leaves every other module builds on: they depend on nothing in the crate.

pub mod memory;
pub mod pace;
pub mod reaper;
pub mod text;
pub mod time;
pub mod usage;

pub use memory::{Account, Charge, OverLimit};
pub use pace::{Pace, Paced};
pub use reaper::Reaper;
pub use time::{Cancel, Deadline, Expired};
pub use usage::Usage;
