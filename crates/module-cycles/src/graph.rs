//! Rings in the file graph: strongly connected components of more than one file (Tarjan's
//! algorithm), each with one shortest loop through it.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

use crate::report::{Edge, Ring};

/// Every ring among `files`, given the imports `edges` between them.
pub fn rings(files: &[PathBuf], edges: &[Edge]) -> Vec<Ring> {
    let index: BTreeMap<&PathBuf, usize> = files.iter().enumerate().map(|(i, f)| (f, i)).collect();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); files.len()];
    let mut by_pair: BTreeMap<(usize, usize), &Edge> = BTreeMap::new();
    for edge in edges {
        let (Some(&a), Some(&b)) = (index.get(&edge.from), index.get(&edge.to)) else {
            continue;
        };
        out[a].push(b);
        by_pair.insert((a, b), edge);
    }
    strongly_connected(&out)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| {
            let cycle = shortest_loop(&out, &component)
                .windows(2)
                .map(|pair| by_pair[&(pair[0], pair[1])].clone())
                .collect();
            let mut members: Vec<PathBuf> = component.iter().map(|&i| files[i].clone()).collect();
            members.sort();
            Ring { files: members, cycle }
        })
        .collect()
}

/// Tarjan's strongly connected components, iteratively (no recursion depth limit).
fn strongly_connected(out: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = out.len();
    let mut order = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next = 0;
    for root in 0..n {
        if order[root] != UNSEEN {
            continue;
        }
        // (node, index of the next edge to look at)
        let mut work = vec![(root, 0usize)];
        order[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (node, ref mut edge)) = work.last_mut() {
            if let Some(&to) = out[node].get(*edge) {
                *edge += 1;
                if order[to] == UNSEEN {
                    order[to] = next;
                    low[to] = next;
                    next += 1;
                    stack.push(to);
                    on_stack[to] = true;
                    work.push((to, 0));
                } else if on_stack[to] {
                    low[node] = low[node].min(order[to]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[node]);
            }
            if low[node] == order[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// A shortest closed walk through the component's smallest node, as a node sequence whose
/// first and last entries are that node.
fn shortest_loop(out: &[Vec<usize>], component: &[usize]) -> Vec<usize> {
    let start = *component.iter().min().expect("components are not empty");
    let inside = |n: usize| component.contains(&n);
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for &to in &out[node] {
            if !inside(to) {
                continue;
            }
            if to == start {
                let mut path = vec![start, node];
                let mut at = node;
                while at != start {
                    at = came_from[&at];
                    path.push(at);
                }
                path.reverse();
                return path;
            }
            if let std::collections::btree_map::Entry::Vacant(slot) = came_from.entry(to) {
                slot.insert(node);
                queue.push_back(to);
            }
        }
    }
    vec![start]
}
