//! The runtime's heavy lanes and inboxes (`connmux::sync::{crew, inbox}`,
//! compiled from the runtime's files with loom's types) under every
//! interleaving loom finds within the preemption bound:
//!
//! - a worker offers messages while its lane's home thread and another
//!   CPU's helper sleep and wake: every message is taken exactly once, and
//!   no taker sleeps with a message it could take still queued (a lost
//!   wake-up parks for ever: loom reports a deadlock);
//! - lane threads post verdicts to a worker's inbox and wake it through an
//!   eventfd: the worker sees every verdict (a lost one leaves it asleep);
//! - a helper whose CPU has no time to spare is woken by the scout's
//!   finding, never by an offer; stopping the crew ends every taker and
//!   the scout, asleep or not.

use connmux_model::sync::crew::{Crew, Taker};
use connmux_model::sync::inbox::Inbox;
use connmux_model::{builder, EventFd};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use std::time::Duration;

const IDLE: Duration = Duration::from_secs(1);

/// A taker's next message as the lane threads ask for it
/// (`connmux::lane`): a look without a wait, then a wait whose sleep is
/// announced before each look.
fn next(crew: &Crew<u32>, who: Taker) -> Option<(usize, u32)> {
    crew.try_next(who).or_else(|| crew.wait_next(who, IDLE))
}

/// How a worker sleeps before each pass.
#[derive(Clone, Copy)]
enum Sleeps {
    /// On its eventfd, every time.
    Always,
    /// As the runtime's worker sleeps while its lane posts quietly
    /// (`Inbox::post_quiet`): on its eventfd only when
    /// `Inbox::sleep_unbounded` says it may sleep with no bound; a bounded
    /// sleep ends by itself (here: it does not block).
    Unbounded,
}

/// A worker's passes until it has `want` posts: sleep as `sleeps` says,
/// drain its eventfd, take the inbox (bounded: a lost wake-up leaves it
/// asleep in `poll`, which loom reports as a deadlock).
fn worker_passes(inbox: &Inbox<u32>, waker: &EventFd, want: usize, sleeps: Sleeps) -> Vec<u32> {
    let mut got = Vec::new();
    for _ in 0..2 * want {
        if got.len() == want {
            break;
        }
        match sleeps {
            Sleeps::Always => waker.poll(),
            Sleeps::Unbounded => {
                if inbox.sleep_unbounded() {
                    waker.poll();
                }
                inbox.awake();
            }
        }
        let _ = waker.drain();
        inbox.take_all(&mut got);
    }
    got
}

/// The home thread sleeps before or after the offer: it gets the message.
#[test]
fn an_offer_wakes_the_lanes_home_thread() {
    builder(3).check(|| {
        let crew = Arc::new(Crew::new(1, 4, 0, 2));
        let home = {
            let crew = crew.clone();
            thread::spawn(move || next(&crew, Taker::Home(0)))
        };
        crew.offer(0, 7u32).unwrap();
        assert_eq!(home.join().unwrap(), Some((0, 7)));
    });
}

/// Lane 0 gets two messages; its home thread and the helper on the other
/// CPU take until both are taken (then the worker stops the crew): each
/// message is taken once, and neither taker sleeps through its share.
#[test]
fn home_and_helper_take_each_message_once() {
    builder(2).check(|| {
        let crew = Arc::new(Crew::new(2, 4, 2, 2));
        // (The scout found the helper's CPU with time to spare.)
        crew.set_spare(1, true);
        let taken = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let takers: Vec<_> = [Taker::Home(0), Taker::Helper(1)]
            .into_iter()
            .map(|who| {
                let (crew, taken, count) = (crew.clone(), taken.clone(), count.clone());
                thread::spawn(move || {
                    while let Some((lane, m)) = next(&crew, who) {
                        assert_eq!(lane, 0);
                        taken.lock().unwrap().push(m);
                        count.fetch_add(1, Ordering::AcqRel);
                    }
                })
            })
            .collect();
        crew.offer(0, 1u32).unwrap();
        crew.offer(0, 2u32).unwrap();
        // Bounded by loom's exploration: a lost wake-up leaves every thread
        // blocked here or parked, which loom reports as a deadlock.
        while count.load(Ordering::Acquire) < 2 {
            thread::yield_now();
        }
        crew.stop();
        for t in takers {
            t.join().unwrap();
        }
        let mut got = taken.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, vec![1, 2]);
    });
}

/// A helper never takes the head of a lane holding fewer than `steal_from`
/// messages, and never from its own CPU's lane.
#[test]
fn a_helper_leaves_a_lone_message_to_its_home_thread() {
    loom::model(|| {
        let crew = Crew::new(2, 4, 2, 2);
        crew.set_spare(0, true);
        crew.set_spare(1, true);
        crew.offer(0, 1u32).unwrap();
        assert_eq!(crew.take(Taker::Helper(1)), None);
        assert_eq!(crew.take(Taker::Helper(0)), None);
        crew.offer(0, 2u32).unwrap();
        assert_eq!(crew.take(Taker::Helper(0)), None, "helper 0 sits on lane 0's CPU");
        assert_eq!(crew.take(Taker::Helper(1)), Some((0, 1)));
        assert_eq!(crew.take(Taker::Home(0)), Some((0, 2)));
    });
}

/// A full lane gives the message back (the worker runs it itself).
#[test]
fn a_full_lane_refuses_an_offer() {
    loom::model(|| {
        let crew = Crew::new(1, 2, 0, 2);
        crew.offer(0, 1u32).unwrap();
        crew.offer(0, 2u32).unwrap();
        assert_eq!(crew.offer(0, 3u32), Err(3));
        assert_eq!(crew.take(Taker::Home(0)), Some((0, 1)));
        crew.offer(0, 3u32).unwrap();
    });
}

/// Stopping ends every taker, whether it sleeps already or not yet.
#[test]
fn stop_ends_sleeping_takers() {
    builder(3).check(|| {
        let crew = Arc::new(Crew::<u32>::new(2, 4, 2, 2));
        let takers: Vec<_> = [Taker::Home(0), Taker::Helper(1)]
            .into_iter()
            .map(|who| {
                let crew = crew.clone();
                thread::spawn(move || next(&crew, who))
            })
            .collect();
        let scout = {
            let crew = crew.clone();
            thread::spawn(move || crew.scout_wait(IDLE))
        };
        crew.stop();
        for t in takers {
            assert_eq!(t.join().unwrap(), None);
        }
        assert!(!scout.join().unwrap(), "the scout ends too");
    });
}

/// A helper whose CPU has no time to spare takes nothing and sleeps
/// through offers; the offer that leaves a lane behind wakes the scout,
/// whose finding (time to spare) wakes the helper, which takes: whatever
/// the interleaving (a lost wake-up on either side parks for ever).
#[test]
fn the_scout_wakes_a_helper_once_its_cpu_has_time() {
    builder(3).check(|| {
        let crew = Arc::new(Crew::<u32>::new(2, 4, 2, 2));
        let helper = {
            let crew = crew.clone();
            thread::spawn(move || next(&crew, Taker::Helper(1)))
        };
        let scout = {
            let crew = crew.clone();
            thread::spawn(move || {
                assert!(crew.scout_wait(IDLE), "a lane is behind");
                crew.set_spare(1, true);
            })
        };
        crew.offer(0, 1).unwrap();
        crew.offer(0, 2).unwrap();
        scout.join().unwrap();
        assert_eq!(helper.join().unwrap(), Some((0, 1)));
        crew.stop();
    });
}

/// A helper whose CPU has no time to spare takes nothing, however far
/// behind the lanes are.
#[test]
fn a_helper_without_time_to_spare_takes_nothing() {
    loom::model(|| {
        let crew = Crew::new(2, 4, 2, 2);
        for m in 0..3u32 {
            crew.offer(0, m).unwrap();
        }
        assert_eq!(crew.take(Taker::Helper(1)), None);
        crew.set_spare(1, true);
        assert_eq!(crew.take(Taker::Helper(1)), Some((0, 0)));
        crew.set_spare(1, false);
        assert_eq!(crew.take(Taker::Helper(1)), None);
    });
}

/// Two lane threads post verdicts to one worker, which sleeps on its
/// eventfd between passes: it sees both, whatever the interleaving.
#[test]
fn a_worker_sees_every_verdict_posted_to_its_inbox() {
    builder(3).check(|| {
        let inbox = Arc::new(Inbox::default());
        let waker = Arc::new(EventFd::new().unwrap());
        let posters: Vec<_> = (0..2u32)
            .map(|i| {
                let (inbox, waker) = (inbox.clone(), waker.clone());
                thread::spawn(move || {
                    if inbox.post(i) {
                        let _ = waker.notify();
                    }
                })
            })
            .collect();
        let mut got = worker_passes(&inbox, &waker, 2, Sleeps::Always);
        for p in posters {
            p.join().unwrap();
        }
        got.sort();
        assert_eq!(got, vec![0, 1]);
    });
}

/// The same inbox with the flag lowered by a plain check-then-clear (no
/// RMW) would be wrong in the other direction too; here: a post made while
/// the worker is taking is seen in a later pass, not lost.
#[test]
fn a_post_during_take_all_is_seen_in_the_next_pass() {
    builder(3).check(|| {
        let inbox = Arc::new(Inbox::default());
        let waker = Arc::new(EventFd::new().unwrap());
        if inbox.post(0u32) {
            let _ = waker.notify();
        }
        let poster = {
            let (inbox, waker) = (inbox.clone(), waker.clone());
            thread::spawn(move || {
                if inbox.post(1) {
                    let _ = waker.notify();
                }
            })
        };
        let got = worker_passes(&inbox, &waker, 2, Sleeps::Always);
        poster.join().unwrap();
        assert_eq!(got.len(), 2);
    });
}

/// A thread that posts `1` with `post` and wakes the owner if told to.
fn post_one(
    inbox: &Arc<Inbox<u32>>,
    waker: &Arc<EventFd>,
    post: fn(&Inbox<u32>, u32) -> bool,
) -> thread::JoinHandle<()> {
    let (inbox, waker) = (inbox.clone(), waker.clone());
    thread::spawn(move || {
        if post(&inbox, 1) {
            let _ = waker.notify();
        }
    })
}

/// A lane thread posts a verdict quietly while the worker is about to
/// sleep: either the worker finds it posted (and bounds its sleep) or the
/// poster finds the worker asleep with no bound (and wakes it).
#[test]
fn a_quiet_post_wakes_a_worker_asleep_with_no_bound() {
    builder(3).check(|| {
        let inbox = Arc::new(Inbox::default());
        let waker = Arc::new(EventFd::new().unwrap());
        let poster = post_one(&inbox, &waker, Inbox::post_quiet);
        let got = worker_passes(&inbox, &waker, 1, Sleeps::Unbounded);
        poster.join().unwrap();
        assert_eq!(got, vec![1]);
    });
}

/// One lane thread posts loudly, another quietly, in any order against the
/// worker's passes: the worker sees both, never asleep for ever.
#[test]
fn quiet_and_loud_posts_both_reach_the_worker() {
    builder(2).check(|| {
        let inbox = Arc::new(Inbox::default());
        let waker = Arc::new(EventFd::new().unwrap());
        let posters: Vec<_> = (0..2u32)
            .map(|i| {
                let (inbox, waker) = (inbox.clone(), waker.clone());
                thread::spawn(move || {
                    let wake = match i {
                        0 => inbox.post(i),
                        _ => inbox.post_quiet(i),
                    };
                    if wake {
                        let _ = waker.notify();
                    }
                })
            })
            .collect();
        let mut got = worker_passes(&inbox, &waker, 2, Sleeps::Unbounded);
        for p in posters {
            p.join().unwrap();
        }
        got.sort();
        assert_eq!(got, vec![0, 1]);
    });
}

/// An application thread's corked reply asks the worker lazily
/// (`Inbox::post_lazy`) while the worker, after a pass that handed it
/// messages, promises to look soon (`Inbox::look_soon`), sleeps bounded
/// (here: it does not block), ends the promise and looks
/// (`Inbox::look_now`), then sleeps on its eventfd with no promise: either
/// the post woke it, or its look after the promise found the post.
#[test]
fn a_lazy_post_reaches_a_worker_whether_it_promised_or_not() {
    builder(3).check(|| {
        let inbox = Arc::new(Inbox::default());
        let waker = Arc::new(EventFd::new().unwrap());
        let poster = post_one(&inbox, &waker, Inbox::post_lazy);
        let mut got = Vec::new();
        inbox.look_soon();
        if inbox.look_now() {
            inbox.take_all(&mut got);
        }
        for _ in 0..2 {
            if !got.is_empty() {
                break;
            }
            waker.poll();
            let _ = waker.drain();
            inbox.take_all(&mut got);
        }
        poster.join().unwrap();
        assert_eq!(got, vec![1]);
    });
}
