//! The README's first snippet as a test: application threads, each on a
//! clone of a receive-disabled socket, answer one connection's requests with
//! `recv_msg` and `send_to`; every request is answered once, by more than
//! one thread, and (with two CPUs or more) on more than one CPU.

#[macro_use]
mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use connmux::SockType;

/// CPU time a request costs its thread.
const WORK: Duration = Duration::from_micros(300);
const REQUESTS: u32 = 1_000;
const IN_FLIGHT: u32 = 16;
const THREADS: usize = 4;

on_both_drivers!(threads_on_clones_answer_one_heavy_connection_on_every_cpu);

fn threads_on_clones_answer_one_heavy_connection_on_every_cpu() {
    // One driver at a time: the other's threads would take the second CPU.
    let _alone = serial();
    let mux = mux_with(|c| c.workers = 2);
    let sock = mux.socket(SockType::Dgram).unwrap();
    // This socket only makes the clones: were it able to receive, the
    // messages steered to it would wait for a reader that never comes.
    sock.set_recv_disable(true).unwrap();
    let (ours, mut peer) = pair();
    mux.attach(&ours, l4()).unwrap();
    let mut threads = Vec::new();
    for t in 0..THREADS {
        let worker = sock.try_clone().unwrap();
        assert!(!worker.recv_disabled().unwrap(), "a clone receives");
        // A thread ends once no request came for a second (the test's end;
        // one that ends sooner closes its socket, whose messages go to the
        // others).
        worker.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        threads.push(std::thread::spawn(move || {
            while let Ok(msg) = worker.recv_msg() {
                let started = Instant::now();
                while started.elapsed() < WORK {
                    std::hint::spin_loop();
                }
                let cpu = connmux_sys::affinity::current_cpu().map_or(u32::MAX, |c| c as u32);
                let mut body = msg.data[4..8].to_vec();
                body.extend_from_slice(&(t as u32).to_be_bytes());
                body.extend_from_slice(&cpu.to_be_bytes());
                if worker.send_to(&framed(&body), msg.psock).is_err() {
                    break;
                }
            }
        }));
    }
    let (jiffies, mine) = (cpu_jiffies(), self_jiffies());
    let (mut answered, mut by_thread, mut by_cpu) = (HashSet::new(), HashSet::new(), HashSet::new());
    let mut sent = 0u32;
    while sent < IN_FLIGHT {
        write_all(&mut peer, &framed(&sent.to_be_bytes()));
        sent += 1;
    }
    for _ in 0..REQUESTS {
        let body = read_framed(&mut peer);
        let word = |i: usize| u32::from_be_bytes(body[i..i + 4].try_into().unwrap());
        assert!(word(0) < sent && answered.insert(word(0)), "reply {} unexpected or twice", word(0));
        by_thread.insert(word(4));
        by_cpu.insert(word(8));
        if sent < REQUESTS {
            write_all(&mut peer, &framed(&sent.to_be_bytes()));
            sent += 1;
        }
    }
    assert_eq!(answered.len(), REQUESTS as usize);
    assert!(by_thread.len() >= 2, "one connection answered by one thread only: {by_thread:?}");
    let cpus = connmux_sys::affinity::available_cpus().map_or(1, |c| c.len());
    // The scheduler puts the threads where there is time: with other
    // processes keeping half a CPU or more busy, one CPU may be all there
    // is, and the test cannot tell.
    let others = others_busy(&jiffies, mine);
    if cpus >= 2 && by_cpu.len() < 2 && others >= 0.5 {
        eprintln!("INCONCLUSIVE: other processes kept {others:.2} CPUs busy; answered on CPUs {by_cpu:?} only");
    } else if cpus >= 2 {
        assert!(
            by_cpu.len() >= 2,
            "one connection answered on one CPU only: {by_cpu:?}; CPUs busy: {}",
            busy_since(&jiffies)
        );
    }
    eprintln!("answered by threads {by_thread:?} on CPUs {by_cpu:?}");
    for t in threads {
        t.join().unwrap();
    }
}
