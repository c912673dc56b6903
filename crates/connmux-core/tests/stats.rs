//! §7 case 43 and the statistics views.

mod common;

use common::*;
use connmux_core::mux::{Mux, RecvFlags, SendFlags, SockType};
use connmux_core::Timestamp;

const NONE: SendFlags = SendFlags { more: false, eor: false, batch: false };

/// The value printed under `label` in a two-line kcm_stats table.
fn column(table: &str, header_word: &str, label: &str) -> u64 {
    let lines: Vec<&str> = table.lines().collect();
    let h = lines.iter().position(|l| l.starts_with(header_word)).expect("table header");
    let labels: Vec<&str> = lines[h].split_whitespace().collect();
    let values: Vec<&str> = lines[h + 1].split_whitespace().collect();
    // The value line has no first-column word: shift by one.
    let i = labels.iter().position(|l| *l == label).expect("label") - 1;
    values[i].parse().expect("number")
}

#[test]
fn case_43_counters_match_their_labels_and_bytes_count_once() {
    let mut m = Mux::new(rr_config());
    let tx = m.socket(SockType::Dgram);
    let rx = m.clone_sock(tx).unwrap();
    let t1 = attach_l4(&mut m);
    let t2 = attach_l4(&mut m);
    // Three 10-byte messages sent (they all go out on T1 while it is reserved).
    for i in 0..3 {
        m.send(tx, &l4_total(10, i), NONE).unwrap();
    }
    let wire = flush(&mut m, t1);
    assert_eq!(wire.len(), 30);
    // The peer echoes them back, split across reads so chunks end mid-message
    // (where strparser double-counts bytes).
    for chunk in wire.chunks(7) {
        m.feed(t2, chunk, Timestamp::ZERO).unwrap();
    }
    // Read them all, fully, on whichever socket got them.
    let mut buf = [0u8; 64];
    let mut read = 0;
    for s in [tx, rx] {
        while let Ok(info) = m.recv(s, &mut buf, RecvFlags::default()) {
            assert!(info.eor);
            read += 1;
        }
    }
    assert_eq!(read, 3);
    let st = m.sock_stats(tx).unwrap();
    assert_eq!((st.tx_msgs, st.tx_bytes), (3, 30));
    let rs = [m.sock_stats(tx).unwrap(), m.sock_stats(rx).unwrap()];
    assert_eq!(rs.iter().map(|s| s.rx_msgs).sum::<u64>(), 3);
    assert_eq!(rs.iter().map(|s| s.rx_bytes).sum::<u64>(), 30);
    let p1 = m.psock_stats(t1).unwrap();
    assert_eq!((p1.tx_msgs, p1.tx_bytes), (3, 30));
    let p2 = m.psock_stats(t2).unwrap();
    assert_eq!((p2.rx_msgs, p2.rx_bytes), (3, 30), "each received byte counted once");
    // Unattach one psock while reserved, one not: the columns must not swap.
    m.send(tx, &l4_total(10, 9), NONE).unwrap(); // reserves T2 (LRU), not written
    m.unattach(t1).unwrap();
    m.unattach(t2).unwrap();
    let table = m.proc_kcm_stats();
    assert_eq!(column(&table, "MUX", "Attach"), 2);
    assert_eq!(column(&table, "MUX", "Unattach"), 2);
    assert_eq!(column(&table, "MUX", "UnattchRsvd"), 1);
    assert_eq!(column(&table, "MUX", "TX-Msgs"), 3);
    assert_eq!(column(&table, "MUX", "TX-Bytes"), 30);
    assert_eq!(column(&table, "MUX", "RX-Bytes"), 30);
    assert_eq!(column(&table, "Psock", "TX-Aborts"), 1);
    // After release the mux totals stay 3/30.
    m.close(tx).unwrap();
    m.close(rx).unwrap();
    let total = m.stats();
    assert_eq!((total.tx_msgs, total.tx_bytes), (3, 30));
    assert_eq!((total.rx_msgs, total.rx_bytes), (3, 30));
}

#[test]
fn proc_kcm_shows_objects_and_status_words() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::Dgram);
    let t1 = attach_l4(&mut m);
    m.feed(t1, &l4_total(100, 1)[..10], Timestamp::ZERO).unwrap();
    m.send(k, &l4_total(10, 1), NONE).unwrap();
    let view = m.proc_kcm();
    let lines: Vec<&str> = view.lines().collect();
    assert_eq!(lines[0], "*** KCM statistics (1 MUX) ****");
    assert!(lines[1].starts_with("Object") && lines[1].ends_with("Status"));
    assert!(lines[2].starts_with("mux") && lines[2].ends_with("KCMs: 1, Psocks 1"));
    assert!(
        lines[3].starts_with("   kcm-0") && lines[3].contains("Psck-0") && lines[3].contains("RxWait"),
        "{}",
        lines[3]
    );
    assert!(
        lines[4].starts_with("   psock-0") && lines[4].contains("Rsvd-0") && lines[4].contains("RxWait=90"),
        "{}",
        lines[4]
    );
}

#[test]
fn psock_counters_fold_into_the_mux_on_unattach() {
    let mut m = Mux::new(rr_config());
    let k = m.socket(SockType::Dgram);
    let t1 = attach_l4(&mut m);
    m.feed(t1, &[l4_total(10, 1), l4_total(12, 2)].concat(), Timestamp::ZERO).unwrap();
    m.feed(t1, &l4_total(10, 1)[..2], Timestamp::ZERO).unwrap();
    let before = m.stats();
    m.unattach(t1).unwrap();
    let after = m.stats();
    assert_eq!(after.rx_msgs, 2);
    assert_eq!(after.rx_bytes, 22);
    assert_eq!(after.psock.rx_need_more_hdr, before.psock.rx_need_more_hdr);
    assert_eq!(after.psocks, 0);
    let _ = recv_all(&mut m, k);
}
