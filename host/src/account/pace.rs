//! A caller's share of the invocation workers, for work the host does on its behalf on a thread
//! of its own: the local store's file system calls and a model's load run on blocking threads,
//! out of sight of the shares that pace guest code, and were CPU beside every tenant's share.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What such work looks at: at its first step, and then at most once per epoch tick where it
/// has steps (a walk's entries, a read's chunks), or once before it begins where it has none
/// (a model's load, one libtorch call), it asks its pace whether the caller may go on: for an
/// invocation, once it holds a slot of its tenant's share of the workers (as at a guest's
/// epoch tick), kept until the next pace or until the work's holder of it is dropped. Work
/// done for no one (tests, tools, the operator) has no pace.
///
/// Work that can give its thread back between steps (the local store's jobs, a model's load)
/// asks [`Pace::try_pace`] on its thread and, told to wait, leaves the thread and waits for
/// [`Pace::turn`] on the async side: a job waiting for its tenant's turn holds no blocking
/// thread. Work that cannot (a profile's layers, run in one libtorch loop) waits in
/// [`Pace::pace`] on its thread.
pub trait Pace: Send + Sync + std::fmt::Debug {
    /// Returns once the caller may go on: true, or false if it never may (its time is up),
    /// and the work stops there. Blocks its thread while it waits.
    fn pace(&self) -> bool;

    /// Without waiting: `Some(true)` if the caller may go on now, `Some(false)` if it never
    /// may, `None` if it must wait for its turn ([`Pace::turn`]) first.
    fn try_pace(&self) -> Option<bool>;

    /// Waits, off any thread, for the caller's turn: true once it has it, false if it never
    /// will (its time is up).
    fn turn(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>>;
}

/// A caller's [`Pace`], if its work is charged to anyone.
pub type Paced<'a> = Option<&'a Arc<dyn Pace>>;
