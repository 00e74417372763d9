//! A caller's share of the invocation workers, for work the host does on its behalf on a thread
//! of its own: the local store's file system calls and a model's load run on blocking threads,
//! out of sight of the shares that pace guest code, and were CPU beside every tenant's share.

use std::sync::Arc;

/// What such work looks at: at its first step, and then at most once per epoch tick where it
/// has steps (a walk's entries, a read's chunks), or once before it begins where it has none
/// (a model's load, one libtorch call), it calls [`Pace::pace`], which returns once the caller
/// may go on: for an invocation, once it holds a slot of its tenant's share of the workers (as
/// at a guest's epoch tick), kept until the next pace or until the work's holder of it is
/// dropped. Work done for no one (tests, tools, the operator) has no pace.
pub trait Pace: Send + Sync + std::fmt::Debug {
    /// Returns once the caller may go on: true, or false if it never may (its time is up),
    /// and the work stops there.
    fn pace(&self) -> bool;
}

/// A caller's [`Pace`], if its work is charged to anyone.
pub type Paced<'a> = Option<&'a Arc<dyn Pace>>;
