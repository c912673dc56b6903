//! A slab whose ids carry a generation: a stale id is an error, never a reused
//! slot (KCM's use-after-free history is about exactly that). Free slots are
//! reused lowest first, which also gives KCM's "lowest unused index" for the
//! `kcm-N` / `psock-N` names. [`Keyed`] keeps values under ids a slab
//! handed out elsewhere.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: BinaryHeap<Reverse<u32>>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab::new()
    }
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab { slots: Vec::new(), free: BinaryHeap::new(), len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Insert and return (index, generation).
    pub(crate) fn insert(&mut self, value: T) -> (u32, u32) {
        self.len += 1;
        if let Some(Reverse(i)) = self.free.pop() {
            let slot = &mut self.slots[i as usize];
            slot.value = Some(value);
            return (i, slot.generation);
        }
        let i = u32::try_from(self.slots.len()).expect("slab index overflow");
        self.slots.push(Slot { generation: 0, value: Some(value) });
        (i, 0)
    }

    #[inline]
    pub(crate) fn get(&self, index: u32, generation: u32) -> Option<&T> {
        match self.slots.get(index as usize) {
            Some(s) if s.generation == generation => s.value.as_ref(),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, index: u32, generation: u32) -> Option<&mut T> {
        match self.slots.get_mut(index as usize) {
            Some(s) if s.generation == generation => s.value.as_mut(),
            _ => None,
        }
    }

    /// Remove; the slot's generation moves on so the old id stays dead.
    pub(crate) fn remove(&mut self, index: u32, generation: u32) -> Option<T> {
        let slot = self.slots.get_mut(index as usize)?;
        if slot.generation != generation {
            return None;
        }
        let v = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(Reverse(index));
        self.len -= 1;
        Some(v)
    }

    /// Live entries in index order: (index, generation, value).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, u32, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| s.value.as_ref().map(|v| (i as u32, s.generation, v)))
    }

    /// [`Slab::iter`] with the values mutable.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, u32, &mut T)> {
        self.slots.iter_mut().enumerate().filter_map(|(i, s)| s.value.as_mut().map(|v| (i as u32, s.generation, v)))
    }
}

/// Values kept under ids another slab handed out (one owner's psocks under
/// the hub's psock ids), by id index: a hole costs a pointer, so an owner
/// holding few of many ids stays small.
pub(crate) struct Keyed<T> {
    slots: Vec<Option<(u32, Box<T>)>>,
    len: usize,
}

impl<T> Default for Keyed<T> {
    fn default() -> Self {
        Keyed { slots: Vec::new(), len: 0 }
    }
}

impl<T> Keyed<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Keep `value` under id (`index`, `generation`), which must be free.
    pub(crate) fn insert_at(&mut self, index: u32, generation: u32, value: T) {
        let i = index as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        assert!(self.slots[i].is_none(), "id {index} kept twice");
        self.slots[i] = Some((generation, Box::new(value)));
        self.len += 1;
    }

    #[inline]
    pub(crate) fn get(&self, index: u32, generation: u32) -> Option<&T> {
        match self.slots.get(index as usize) {
            Some(Some((g, v))) if *g == generation => Some(v),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, index: u32, generation: u32) -> Option<&mut T> {
        match self.slots.get_mut(index as usize) {
            Some(Some((g, v))) if *g == generation => Some(v),
            _ => None,
        }
    }

    pub(crate) fn remove(&mut self, index: u32, generation: u32) -> Option<T> {
        let slot = self.slots.get_mut(index as usize)?;
        if slot.as_ref().is_none_or(|(g, _)| *g != generation) {
            return None;
        }
        self.len -= 1;
        slot.take().map(|(_, v)| *v)
    }

    /// Live entries in index order: (index, generation, value).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, u32, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|(g, v)| (i as u32, *g, &**v)))
    }

    /// [`Keyed::iter`] with the values mutable.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, u32, &mut T)> {
        self.slots.iter_mut().enumerate().filter_map(|(i, s)| s.as_mut().map(|(g, v)| (i as u32, *g, &mut **v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_ids_do_not_reach_a_reused_slot() {
        let mut s = Slab::new();
        let (a, ga) = s.insert("a");
        let (b, _) = s.insert("b");
        assert_eq!((a, b), (0, 1));
        assert_eq!(s.remove(a, ga), Some("a"));
        assert_eq!(s.remove(a, ga), None);
        let (c, gc) = s.insert("c");
        assert_eq!(c, 0, "lowest free index reused");
        assert_ne!(gc, ga);
        assert_eq!(s.get(a, ga), None);
        assert_eq!(s.get(c, gc), Some(&"c"));
        assert_eq!(s.len(), 2);
    }
}
