//! A Rust program serves 9P on its own `Mux` through the library: a client
//! over TCP on loopback reads and writes the export, the counters count it,
//! and shutdown ends the server: its threads joined, the port refused after it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use connmux::{Config as MuxConfig, Mux};
use connmux_9p::rmsg::Rmsg;
use connmux_9p::{Tmsg, NOFID};
use connmux_9p_server::{Config, Server};

fn call(c: &mut TcpStream, tag: u16, m: &Tmsg<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    m.encode(tag, &mut b);
    c.write_all(&b).unwrap();
    let mut size = [0u8; 4];
    c.read_exact(&mut size).unwrap();
    let mut r = size.to_vec();
    r.resize(u32::from_le_bytes(size) as usize, 0);
    c.read_exact(&mut r[4..]).unwrap();
    assert_eq!(u16::from_le_bytes([r[5], r[6]]), tag);
    if let (_, Rmsg::Lerror { errno }) = Rmsg::decode(&r).unwrap() {
        panic!("{m:?}: Rlerror {errno}");
    }
    r
}

/// Threads of this process whose name starts with `prefix` (`comm`).
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with(prefix))
        .count()
}

#[test]
fn a_program_serves_9p_on_its_own_mux() {
    let ex = std::env::temp_dir().join(format!("connmux-9p-embed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ex);
    std::fs::create_dir_all(&ex).unwrap();
    std::fs::write(ex.join("hello"), b"hello from the library").unwrap();

    let mux = Mux::new(MuxConfig::default()).unwrap();
    let cfg = Config { export: ex.clone(), listen: "127.0.0.1:0".parse().unwrap(), fs_threads: 2, ..Config::default() };
    let server = Server::start(mux, cfg).unwrap();
    let addr = server.local_addr();

    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    call(&mut c, 1, &Tmsg::Version { msize: 65536, version: "9P2000.L" });
    let me = rustix::process::geteuid().as_raw();
    call(&mut c, 2, &Tmsg::Attach { fid: 0, afid: NOFID, uname: "", aname: "", n_uname: me });
    call(&mut c, 3, &Tmsg::Walk { fid: 0, newfid: 1, names: vec!["hello"] });
    call(&mut c, 4, &Tmsg::Lopen { fid: 1, flags: 0 });
    let r = call(&mut c, 5, &Tmsg::Read { fid: 1, offset: 0, count: 100 });
    assert_eq!(&r[11..], b"hello from the library");
    call(&mut c, 6, &Tmsg::Lcreate { fid: 0, name: "written", flags: 2, mode: 0o644, gid: 0 });
    call(&mut c, 7, &Tmsg::Write { fid: 0, offset: 0, data: b"by a client" });
    assert_eq!(std::fs::read(ex.join("written")).unwrap(), b"by a client");

    let counters = server.counters();
    assert!(counters.contains("requests=7\n"), "{counters}");
    assert!(counters.contains("open_files=2\n"), "{counters}");
    assert_eq!(server.stats().errors.load(std::sync::atomic::Ordering::Relaxed), 0);

    // The file-system threads and the waker run while it serves; shutdown
    // joins them, promptly.
    // (A thread names itself when it first runs.)
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while threads_named("connmux-9p-") < 3 {
        assert!(std::time::Instant::now() < end, "2 file-system threads and the waker not there after 10 s");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let t0 = std::time::Instant::now();
    server.shutdown();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "shutdown took {took:?}");
    // (A joined thread may still be listed for a moment: the kernel wakes
    // its joiner a little before it takes the thread off the list.)
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while threads_named("connmux-9p-") != 0 {
        assert!(std::time::Instant::now() < end, "a thread of the server outlived its shutdown");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Its connection is gone, and nothing listens.
    let mut b = [0u8; 1];
    assert!(matches!(c.read(&mut b), Ok(0) | Err(_)));
    assert!(TcpStream::connect(addr).is_err(), "still listening after shutdown");
    let _ = std::fs::remove_dir_all(&ex);
}
