//! The descriptor budget: open files and `O_PATH` handles, each capped in
//! total and per connection, like the memory budget.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use rustix::io::Errno;

/// Descriptors of one kind (open files, or `O_PATH` handles), capped in
/// total and per connection: the descriptor budget.
pub struct Budget {
    /// Held at most, in all.
    pub max_total: usize,
    /// Held at most by one connection.
    pub max_conn: usize,
    total: AtomicUsize,
    /// Takes refused (over either cap).
    pub refused: AtomicU64,
}

impl Budget {
    pub fn new(max_total: usize, max_conn: usize) -> Arc<Budget> {
        Arc::new(Budget { max_total, max_conn, total: AtomicUsize::new(0), refused: AtomicU64::new(0) })
    }

    /// Held now.
    pub fn used(&self) -> usize {
        self.total.load(Relaxed)
    }

    /// One descriptor for a connection whose count is `mine`: EMFILE over
    /// the connection's cap, ENFILE over the total.
    pub fn take(self: &Arc<Self>, mine: &Arc<AtomicUsize>) -> Result<Slot, Errno> {
        if mine.fetch_add(1, Relaxed) >= self.max_conn {
            mine.fetch_sub(1, Relaxed);
            self.refused.fetch_add(1, Relaxed);
            return Err(Errno::MFILE);
        }
        if self.total.fetch_add(1, Relaxed) >= self.max_total {
            self.total.fetch_sub(1, Relaxed);
            mine.fetch_sub(1, Relaxed);
            self.refused.fetch_add(1, Relaxed);
            return Err(Errno::NFILE);
        }
        Ok(Slot { budget: self.clone(), mine: mine.clone() })
    }
}

/// One descriptor of a [`Budget`], given back when dropped.
pub struct Slot {
    budget: Arc<Budget>,
    mine: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.mine.fetch_sub(1, Relaxed);
        self.budget.total.fetch_sub(1, Relaxed);
    }
}
