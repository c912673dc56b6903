//! The runtime's own cross-thread primitives (`crates/connmux/src/sync/`),
//! compiled here from the very same files with loom's types in [`prim`]:
//! loom checks the code the workers run, not a copy of it.

#[path = "../../../connmux/src/sync/crew.rs"]
pub mod crew;
#[path = "../../../connmux/src/sync/inbox.rs"]
pub mod inbox;
#[path = "../../../connmux/src/sync/keep.rs"]
pub mod keep;
pub mod prim;
#[path = "../../../connmux/src/sync/ready.rs"]
pub mod ready;
#[path = "../../../connmux/src/sync/writer.rs"]
pub mod writer;
