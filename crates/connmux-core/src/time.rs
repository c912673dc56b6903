//! Time as the caller tells it: the core never reads a clock.

use std::time::Duration;

/// A point in time in nanoseconds since an epoch the caller chooses (the runtime
/// uses a process-wide monotonic origin; tests start at zero).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);

    pub fn from_nanos(n: u64) -> Self {
        Timestamp(n)
    }
    pub fn as_nanos(self) -> u64 {
        self.0
    }
    /// `self + d`, saturating (a method, not `+`: it never overflows).
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64))
    }
    /// Time elapsed from `earlier` to `self` (zero if `earlier` is later).
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}
