//! The checker against small crates written to have (or not have) a ring.

use std::path::{Path, PathBuf};

use module_cycles::check_crate;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .join("src/lib.rs")
}

/// File names (relative to the fixture's src) of each ring found.
fn rings(name: &str) -> Vec<Vec<String>> {
    let root = fixture(name);
    let src = root.parent().unwrap().to_path_buf();
    let report = check_crate(&root).expect("fixture reads");
    report
        .rings
        .iter()
        .map(|ring| {
            ring.files
                .iter()
                .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn two_files_that_use_each_other_are_a_ring() {
    assert_eq!(rings("two_files"), vec![vec!["a.rs", "b.rs"]]);
}

#[test]
fn the_loop_shown_is_closed_and_names_the_lines() {
    let report = check_crate(&fixture("two_files")).unwrap();
    let cycle = &report.rings[0].cycle;
    assert_eq!(cycle.len(), 2);
    assert_eq!(cycle[0].to, cycle[1].from);
    assert_eq!(cycle[1].to, cycle[0].from);
    let from_b = cycle.iter().find(|e| e.from.ends_with("b.rs")).unwrap();
    assert_eq!((from_b.line, from_b.path.as_str()), (1, "super::a::A"));
}

#[test]
fn a_root_that_re_exports_is_not_a_hub() {
    // lib.rs re-exports Error and Node; node.rs names `crate::Error`, which is error.rs's.
    assert!(rings("reexports").is_empty());
    let report = check_crate(&fixture("reexports")).unwrap();
    assert!(report
        .edges
        .iter()
        .any(|e| e.from.ends_with("node.rs") && e.to.ends_with("error.rs")));
    assert!(!report.edges.iter().any(|e| e.to.ends_with("lib.rs")));
}

#[test]
fn a_child_using_its_parents_items_while_the_parent_uses_it_is_a_ring() {
    assert_eq!(rings("parent_child"), vec![vec!["tickets/holder.rs", "tickets/mod.rs"]]);
}

#[test]
fn test_only_code_does_not_count() {
    assert!(rings("test_only").is_empty());
}

#[test]
fn a_glob_import_is_followed() {
    assert_eq!(rings("globs"), vec![vec!["a.rs", "b.rs"]]);
}

#[test]
fn a_longer_loop_is_one_ring_and_its_leaf_is_outside_it() {
    assert_eq!(rings("long_ring"), vec![vec!["a.rs", "b.rs", "c.rs", "d.rs"]]);
    let report = check_crate(&fixture("long_ring")).unwrap();
    assert_eq!(report.rings[0].cycle.len(), 4);
}

#[test]
fn a_missing_module_file_is_a_clear_error() {
    let error = check_crate(&fixture("missing_mod")).unwrap_err().to_string();
    assert!(error.contains("mod nowhere;"), "{error}");
    assert!(error.contains("nowhere.rs"), "{error}");
}
