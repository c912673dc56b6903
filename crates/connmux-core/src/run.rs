//! Whole messages framed where they lie in a read, described run by run.
//!
//! A client's requests are alike: a read of 32 calls is nearly always 32
//! messages of one length laid end to end. Framing finds such a run by
//! comparing header bytes ([`crate::parser::Parser::frame_batch`]) and
//! describes it in one [`Run`] (where it starts, each message's length, how
//! many), not one range per message: nothing is written per message, and
//! whoever answers them steps through the read by the run's length
//! ([`Messages`], what a handler is given), with no range to load and
//! check for each. A message that is not part of a longer run is a run of
//! one.

use std::ops::Range;

/// `count` messages laid end to end in a read from offset `at`, each
/// `stride` bytes on the wire, of which the application receives the `len`
/// bytes from `skip` on (all of them, `skip` 0 and `len` = `stride`, unless
/// the parser strips a header: [`crate::parser::Parser::finish_in_place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub at: usize,
    pub stride: usize,
    pub count: usize,
    pub skip: usize,
    pub len: usize,
}

impl Run {
    /// `count` whole messages of `stride` bytes from `at`.
    #[inline]
    pub fn whole(at: usize, stride: usize, count: usize) -> Run {
        Run { at, stride, count, skip: 0, len: stride }
    }

    /// One message of `wire` bytes at `at`, of which the application
    /// receives `part` (a range within the message, `finish_in_place`'s).
    #[inline]
    pub fn one(at: usize, wire: usize, part: Range<usize>) -> Run {
        Run { at, stride: wire, count: 1, skip: part.start, len: part.end.saturating_sub(part.start) }
    }

    /// Whether the application receives each message as it is on the wire.
    #[inline]
    pub fn is_whole(&self) -> bool {
        self.skip == 0 && self.len == self.stride
    }

    /// Where the run's wire bytes end.
    #[inline]
    pub fn end(&self) -> usize {
        self.at + self.stride * self.count
    }

    /// What the application receives of the `i`th message (`i < count`).
    #[inline]
    pub fn range(&self, i: usize) -> Range<usize> {
        let start = self.at + i * self.stride + self.skip;
        start..start + self.len
    }

    /// The run's messages, as ranges of the read.
    pub fn ranges(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..self.count).map(|i| self.range(i))
    }

    /// Whether the run is well formed (its messages non-empty on the wire,
    /// each part within its message) and lies within `data_len` bytes.
    #[inline]
    fn fits(&self, data_len: usize) -> bool {
        self.stride > 0
            && self.count > 0
            && self.skip.checked_add(self.len).is_some_and(|e| e <= self.stride)
            && self.stride.checked_mul(self.count).and_then(|w| w.checked_add(self.at)).is_some_and(|e| e <= data_len)
    }
}

/// The messages of `runs`, in order.
#[inline]
pub fn count(runs: &[Run]) -> usize {
    runs.iter().map(|r| r.count).sum()
}

/// The messages of `runs` as ranges of the read, in order (the form a test
/// compares, or a path that is not hot walks).
pub fn ranges(runs: &[Run]) -> Vec<Range<usize>> {
    runs.iter().flat_map(Run::ranges).collect()
}

/// Whole messages of one read, where they lie: `data` and the runs framed
/// in it, less the messages already taken from the front ([`Messages::after`],
/// [`Messages::next_run`]). What a handler is given to answer a read's
/// requests in one call.
#[derive(Clone, Copy, Debug)]
pub struct Messages<'a> {
    data: &'a [u8],
    runs: &'a [Run],
    /// Messages of `runs[0]` already taken.
    taken: usize,
    /// Messages left (kept, not summed on each ask: a worker asks often).
    len: usize,
}

impl<'a> Messages<'a> {
    /// The messages of `runs` in `data`, up to the first run that is not well
    /// formed or does not lie within `data` (framing never makes one: the
    /// check keeps every access below in bounds).
    #[inline]
    pub fn new(data: &'a [u8], runs: &'a [Run]) -> Messages<'a> {
        let (mut good, mut len) = (0, 0);
        for r in runs {
            if !r.fits(data.len()) {
                break;
            }
            good += 1;
            len += r.count;
        }
        Messages { data, runs: &runs[..good], taken: 0, len }
    }

    /// How many messages.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The messages after the first `n` (none when there are fewer).
    #[inline]
    pub fn after(mut self, mut n: usize) -> Messages<'a> {
        if n >= self.len {
            return Messages { data: self.data, runs: &[], taken: 0, len: 0 };
        }
        self.len -= n;
        // Bounded: each turn drops a run or ends (n < what is left).
        while let Some(r) = self.runs.first() {
            let left = r.count - self.taken;
            if n < left {
                self.taken += n;
                break;
            }
            n -= left;
            self.runs = &self.runs[1..];
            self.taken = 0;
        }
        self
    }

    /// The first message, as the application receives it.
    #[inline]
    pub fn first(&self) -> Option<&'a [u8]> {
        let r = self.runs.first()?;
        self.data.get(r.range(self.taken))
    }

    /// The first run's messages not yet taken.
    #[inline]
    pub fn first_run(&self) -> Option<RunView<'a>> {
        let r = self.runs.first()?;
        let from = r.at + self.taken * r.stride;
        let wire = self.data.get(from..r.end())?;
        Some(RunView { wire, stride: r.stride, count: r.count - self.taken, skip: r.skip, len: r.len })
    }

    /// Take the first run's messages not yet taken.
    #[inline]
    pub fn next_run(&mut self) -> Option<RunView<'a>> {
        let run = self.first_run()?;
        self.runs = &self.runs[1..];
        self.taken = 0;
        self.len -= run.count;
        Some(run)
    }

    /// The runs, the first less what was taken of it.
    pub fn runs(&self) -> impl Iterator<Item = RunView<'a>> + 'a {
        let mut rest = *self;
        std::iter::from_fn(move || rest.next_run())
    }

    /// Every message, as the application receives it, in order.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.runs().flat_map(|r| r.messages())
    }
}

/// One run's messages in the read: `wire` holds `count` of them end to
/// end, each `stride` bytes, of which the application receives `len` from
/// `skip` on.
#[derive(Clone, Copy, Debug)]
pub struct RunView<'a> {
    pub wire: &'a [u8],
    pub stride: usize,
    pub count: usize,
    pub skip: usize,
    pub len: usize,
}

impl<'a> RunView<'a> {
    /// Whether each message is received as it is on the wire (then
    /// `wire.chunks_exact(stride)` are the messages).
    #[inline]
    pub fn is_whole(&self) -> bool {
        self.skip == 0 && self.len == self.stride
    }

    /// The messages, as the application receives them.
    #[inline]
    pub fn messages(self) -> impl ExactSizeIterator<Item = &'a [u8]> + 'a {
        let part = self.skip..self.skip + self.len;
        self.wire.chunks_exact(self.stride).map(move |m| &m[part.clone()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_walk_runs_in_order_and_after_cuts_inside_a_run() {
        let data: Vec<u8> = (0..40).collect();
        // Three of 4 bytes from 0, one of 8 (its 2..6 received), two of 6.
        let runs = [Run::whole(0, 4, 3), Run::one(12, 8, 2..6), Run { at: 20, stride: 6, count: 2, skip: 1, len: 5 }];
        let m = Messages::new(&data, &runs);
        assert_eq!(m.len(), 6);
        let all: Vec<&[u8]> = m.iter().collect();
        assert_eq!(all, vec![&data[0..4], &data[4..8], &data[8..12], &data[14..18], &data[21..26], &data[27..32]]);
        assert_eq!(ranges(&runs), vec![0..4, 4..8, 8..12, 14..18, 21..26, 27..32]);
        let m2 = m.after(2);
        assert_eq!(m2.len(), 4);
        assert_eq!(m2.first(), Some(&data[8..12]));
        assert_eq!(m2.first_run().map(|r| r.count), Some(1));
        assert_eq!(m2.after(1).first(), Some(&data[14..18]));
        assert_eq!(m2.after(3).iter().collect::<Vec<_>>(), vec![&data[27..32]]);
        assert!(m.after(6).is_empty());
        assert!(m.after(60).is_empty());
        let mut m3 = m.after(1);
        let run = m3.next_run().unwrap();
        assert_eq!((run.count, run.wire, m3.len()), (2, &data[4..12], 3));
        assert_eq!(m3.runs().map(|r| r.count).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn a_run_outside_the_data_ends_the_messages_there() {
        let data = [0u8; 16];
        let runs = [Run::whole(0, 4, 2), Run::whole(8, 4, 3), Run::whole(0, 4, 1)];
        assert_eq!(Messages::new(&data, &runs).len(), 2);
        let bad_part = [Run { at: 0, stride: 4, count: 1, skip: 3, len: 2 }];
        assert!(Messages::new(&data, &bad_part).is_empty());
        let empty_stride = [Run::whole(0, 0, 1)];
        assert!(Messages::new(&data, &empty_stride).is_empty());
    }
}
