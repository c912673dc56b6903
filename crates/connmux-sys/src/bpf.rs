//! bpf(2): load a `BPF_PROG_TYPE_SOCKET_FILTER` program, run it once on some
//! bytes with `BPF_PROG_TEST_RUN`, and create the array maps such programs keep
//! state in.
//!
//! The kernel backend attaches programs loaded here as KCM parsers; the BPF
//! interpreter's tests use [`prog_test_run`] as the oracle for its semantics.
//!
//! What this does not do: map types other than arrays, map element calls from
//! userspace, BTF, pinning, attaching, or any program type other than socket
//! filters.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_TEST_RUN: libc::c_int = 10;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
const BPF_MAP_TYPE_ARRAY: u32 = 2;

/// Bytes of the verifier's log fetched when a load is refused.
const LOG_SIZE: usize = 1 << 16;

/// The `BPF_PROG_LOAD` part of `union bpf_attr`, up to `expected_attach_type`.
/// The kernel accepts a shorter attr and treats the missing tail as zero.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// The `BPF_MAP_CREATE` part of `union bpf_attr`, up to `map_flags`. The
/// kernel accepts a shorter attr and treats the missing tail as zero.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// The `BPF_PROG_TEST_RUN` part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

fn sys_bpf<T>(cmd: libc::c_int, attr: &mut T) -> libc::c_long {
    // SAFETY: `attr` is a live, initialised `#[repr(C)]` prefix of `union bpf_attr`
    // for `cmd`, and its size is passed with it; every pointer inside it was set by
    // the caller from a borrow that outlives this call.
    unsafe {
        libc::syscall(libc::SYS_bpf, cmd, attr as *mut T as *mut libc::c_void, std::mem::size_of::<T>() as libc::c_uint)
    }
}

/// Create a `BPF_MAP_TYPE_ARRAY` map of `max_entries` values of `value_size`
/// bytes each (4-byte keys, zero-filled), as the fd programs reference through
/// `BPF_PSEUDO_MAP_FD`. The map lives as long as the fd or a program that uses it.
///
/// Errors as bpf(2) gives them: `EPERM` without `CAP_BPF`, `EINVAL` for a zero
/// size or count, `E2BIG`/`ENOMEM` for a map too large.
pub fn map_create_array(value_size: u32, max_entries: u32) -> io::Result<OwnedFd> {
    let mut attr = MapCreateAttr { map_type: BPF_MAP_TYPE_ARRAY, key_size: 4, value_size, max_entries, map_flags: 0 };
    let fd = sys_bpf(BPF_MAP_CREATE, &mut attr);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this new fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Load `insns` (each one `struct bpf_insn` as its 8 bytes in host order, as
/// `clang -target bpf` writes them) as a socket-filter program.
///
/// On refusal the error carries the verifier's log in its message.
pub fn prog_load_socket_filter(insns: &[[u8; 8]], license: &str) -> io::Result<OwnedFd> {
    let license =
        CString::new(license).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "licence contains NUL"))?;
    let insn_cnt =
        u32::try_from(insns.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many instructions"))?;
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_SOCKET_FILTER,
        insn_cnt,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        ..Default::default()
    };
    let fd = sys_bpf(BPF_PROG_LOAD, &mut attr);
    if fd >= 0 {
        // SAFETY: the kernel just returned this new fd to us; nothing else owns it.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
    }
    let err = io::Error::last_os_error();
    // Load again with the log on, only to say why.
    let mut log = vec![0u8; LOG_SIZE];
    attr.log_level = 1;
    attr.log_size = LOG_SIZE as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    let fd = sys_bpf(BPF_PROG_LOAD, &mut attr);
    if fd >= 0 {
        // Refused without the log but accepted with it: unlikely, keep the fd.
        // SAFETY: as above, a fresh fd returned by the kernel.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    Err(io::Error::new(err.kind(), format!("BPF_PROG_LOAD: {err}; verifier log:\n{}", text.trim_end())))
}

/// Run the program once on `data` with `BPF_PROG_TEST_RUN` and return its 32-bit
/// return value.
///
/// For socket filters the kernel takes the first 14 bytes of `data` as an Ethernet
/// header and runs the program on the rest, so callers prepend 14 bytes to the
/// message; fewer than 14 bytes are refused with `EINVAL`. The kernel also caps
/// `data` at a little under a page.
pub fn prog_test_run(fd: BorrowedFd<'_>, data: &[u8]) -> io::Result<u32> {
    let data_size_in =
        u32::try_from(data.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "data too long"))?;
    let mut attr = TestRunAttr {
        prog_fd: fd.as_raw_fd() as u32,
        data_size_in,
        data_in: data.as_ptr() as u64,
        repeat: 1,
        ..Default::default()
    };
    if sys_bpf(BPF_PROG_TEST_RUN, &mut attr) < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr.retval)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = code;
        b[1] = dst | (src << 4);
        b[2..4].copy_from_slice(&off.to_le_bytes());
        b[4..8].copy_from_slice(&imm.to_le_bytes());
        b
    }

    /// The example from the platform notes: `r0 = ld_abs_w[0]; r0 += 4; exit`.
    /// Needs root (CAP_BPF); run by the BPF oracle tests as well.
    #[test]
    fn ld_abs_word_plus_four() {
        assert!(is_root(), "this test needs root: BPF_PROG_LOAD and BPF_PROG_TEST_RUN require CAP_BPF");
        {
            let prog = [
                insn(0xbf, 6, 1, 0, 0), // r6 = r1 (LD_ABS wants the context in r6)
                insn(0x20, 0, 0, 0, 0), // r0 = ntohl(*(u32 *)(skb->data + 0))
                insn(0x07, 0, 0, 0, 4), // r0 += 4
                insn(0x95, 0, 0, 0, 0), // exit
            ];
            let fd = prog_load_socket_filter(&prog, "GPL").expect("BPF_PROG_LOAD as root");
            let mut frame = vec![0u8; 14];
            frame.extend_from_slice(&[0, 0, 0, 10]);
            assert_eq!(prog_test_run(fd.as_fd(), &frame).unwrap(), 14);
            frame.pop();
            assert_eq!(prog_test_run(fd.as_fd(), &frame).unwrap(), 0);
            let err = prog_test_run(fd.as_fd(), &[0u8; 13]).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        }
    }

    #[test]
    fn verifier_log_on_refusal() {
        assert!(is_root(), "this test needs root: BPF_PROG_LOAD requires CAP_BPF");
        // exit without setting r0: the verifier refuses "R0 !read_ok".
        let err = prog_load_socket_filter(&[insn(0x95, 0, 0, 0, 0)], "GPL").unwrap_err();
        assert!(err.to_string().contains("R0"), "{err}");
    }

    #[test]
    fn array_map_create() {
        assert!(is_root(), "this test needs root: BPF_MAP_CREATE requires CAP_BPF");
        let m = map_create_array(8, 1).expect("BPF_MAP_CREATE as root");
        assert!(m.as_raw_fd() >= 0);
        // A zero-sized value is refused.
        assert_eq!(map_create_array(0, 1).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        // A program that looks up element 0 of the map passes the verifier
        // (the map fd resolves), and answers 1 when the element exists.
        let fd = m.as_raw_fd();
        let prog = [
            insn(0x62, 10, 0, -4, 0), // *(u32 *)(r10 - 4) = 0
            insn(0x18, 1, 1, 0, fd),  // r1 = map (ld_imm64, pseudo map fd)
            insn(0x00, 0, 0, 0, 0),
            insn(0xbf, 2, 10, 0, 0), // r2 = r10
            insn(0x07, 2, 0, 0, -4), // r2 -= 4
            insn(0x85, 0, 0, 0, 1),  // call bpf_map_lookup_elem
            insn(0xb7, 1, 0, 0, 1),  // r1 = 1
            insn(0x15, 0, 0, 1, 0),  // if r0 == 0 skip
            insn(0xbf, 0, 1, 0, 0),  // r0 = r1
            insn(0x95, 0, 0, 0, 0),  // exit
        ];
        let p = prog_load_socket_filter(&prog, "GPL").expect("program using the map loads");
        assert_eq!(prog_test_run(p.as_fd(), &[0u8; 20]).unwrap(), 1);
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }
}
