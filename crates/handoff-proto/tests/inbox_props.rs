//! Properties of the inbox under any mix of arrivals, takes and closed connections: no
//! message is lost or taken twice, each connection's come in order, and a closed
//! connection's come only when no open connection has one waiting.

use std::collections::{HashSet, VecDeque};

use handoff_proto::inbox::{Inbox, Queued};
use proptest::prelude::*;

#[derive(Debug)]
struct M {
    conn: usize,
    weight: u64,
    seq: u32,
}

impl Queued for M {
    fn connection(&self) -> usize {
        self.conn
    }
    fn weight(&self) -> u64 {
        self.weight
    }
}

#[derive(Debug, Clone)]
enum Op {
    Push { conn: usize, weight: u64 },
    Pop,
    Close { conn: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..6, prop_oneof![1u64..3000, 100_000u64..10_000_000]).prop_map(|(conn, weight)| Op::Push { conn, weight }),
        3 => Just(Op::Pop),
        1 => (0usize..6).prop_map(|conn| Op::Close { conn }),
    ]
}

proptest! {
    #[test]
    fn nothing_is_lost_and_order_holds(ops in proptest::collection::vec(op(), 1..400)) {
        let mut inbox = Inbox::default();
        // What the model says waits, per connection, and which connections closed (a
        // connection is reopened by a message that comes after its queue emptied).
        let mut waiting: Vec<VecDeque<u32>> = vec![VecDeque::new(); 6];
        let mut closed: HashSet<usize> = HashSet::new();
        let mut seq = 0u32;
        let check_pop = |inbox: &mut Inbox<M>, waiting: &mut [VecDeque<u32>], closed: &mut HashSet<usize>| {
            let got = inbox.try_pop();
            let any = waiting.iter().any(|q| !q.is_empty());
            prop_assert_eq!(got.is_some(), any);
            if let Some(m) = got {
                prop_assert_eq!(waiting[m.conn].pop_front(), Some(m.seq), "in order, none lost");
                let open_waiting = (0..6).any(|c| !closed.contains(&c) && !waiting[c].is_empty());
                if closed.contains(&m.conn) {
                    prop_assert!(!open_waiting, "a closed connection's message before an open one's");
                }
                if waiting[m.conn].is_empty() {
                    closed.remove(&m.conn);
                }
            }
            Ok(())
        };
        for op in ops {
            match op {
                Op::Push { conn, weight } => {
                    let was_empty = waiting.iter().all(VecDeque::is_empty);
                    prop_assert_eq!(inbox.push(M { conn, weight, seq }), was_empty);
                    waiting[conn].push_back(seq);
                    seq += 1;
                }
                Op::Pop => check_pop(&mut inbox, &mut waiting, &mut closed)?,
                Op::Close { conn } => {
                    inbox.closed(conn);
                    if !waiting[conn].is_empty() {
                        closed.insert(conn);
                    }
                }
            }
            prop_assert_eq!(inbox.len(), waiting.iter().map(VecDeque::len).sum::<usize>());
        }
        while !inbox.is_empty() {
            check_pop(&mut inbox, &mut waiting, &mut closed)?;
        }
        prop_assert!(waiting.iter().all(VecDeque::is_empty));
    }
}
