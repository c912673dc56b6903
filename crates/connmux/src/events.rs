//! The psock failures a mux reports ([`crate::Mux::events`]): a bounded
//! queue the runtime posts to and the application reads.
//!
//! Owns [`Events`], the crate's own face on the queue, so that which channel
//! carries the events is not part of the API. Names only `shared` (the event
//! type).

use std::sync::mpsc::{RecvError, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use crate::shared::PsockEvent;

/// The receiving end of a mux's psock events ([`crate::Mux::events`]): one
/// [`PsockEvent`] per failed or closed connection, in the order they came,
/// for every thread that holds the mux (each event goes to one reader).
///
/// The errors are std's (`std::sync::mpsc`): an empty queue is
/// [`TryRecvError::Empty`] or [`RecvTimeoutError::Timeout`]; the queue is
/// never disconnected while the mux lives, and [`Events::recv`] returns
/// [`RecvError`] only if it is.
///
/// ```no_run
/// # let mux = connmux::Mux::new(connmux::Config::default())?;
/// while let Ok(ev) = mux.events().try_recv() {
///     println!("psock {:?} failed: {:?}", ev.psock, ev.error);
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct Events {
    rx: crossbeam::channel::Receiver<PsockEvent>,
}

impl Events {
    /// A new queue holding at most `cap` events (at least 1), and the sender
    /// the runtime posts to.
    pub(crate) fn bounded(cap: usize) -> (crossbeam::channel::Sender<PsockEvent>, Events) {
        let (tx, rx) = crossbeam::channel::bounded(cap.max(1));
        (tx, Events { rx })
    }

    /// The next event, waiting for one without a bound.
    pub fn recv(&self) -> Result<PsockEvent, RecvError> {
        self.rx.recv().map_err(|_| RecvError)
    }

    /// The next event if one is queued.
    pub fn try_recv(&self) -> Result<PsockEvent, TryRecvError> {
        self.rx.try_recv().map_err(|e| match e {
            crossbeam::channel::TryRecvError::Empty => TryRecvError::Empty,
            crossbeam::channel::TryRecvError::Disconnected => TryRecvError::Disconnected,
        })
    }

    /// The next event, waiting at most `timeout` for one.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<PsockEvent, RecvTimeoutError> {
        self.rx.recv_timeout(timeout).map_err(|e| match e {
            crossbeam::channel::RecvTimeoutError::Timeout => RecvTimeoutError::Timeout,
            crossbeam::channel::RecvTimeoutError::Disconnected => RecvTimeoutError::Disconnected,
        })
    }

    /// Events queued now.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether no event is queued now.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    /// The events queued now, taken without waiting.
    pub fn try_iter(&self) -> impl Iterator<Item = PsockEvent> + '_ {
        self.rx.try_iter()
    }

    /// Every event as it comes, waiting for each (ends only if the queue is
    /// disconnected, which it is not while the mux lives).
    pub fn iter(&self) -> impl Iterator<Item = PsockEvent> + '_ {
        self.rx.iter()
    }
}
