//! A DataSets.jl user's habits: catalogs of version 0, the dataset name rule, specs with a query and a
//! fragment, opening what a spec selects, and stacks of catalogs. The fixtures (`fixtures/julia/`) are shared
//! with the Python peer's tests (`python/tests/test_datasets_jl.py`), so both languages agree on each case.

mod common;

use std::path::{Path, PathBuf};

use common::TempDir;
use handoff_data::{check_name, Cache, CacheConfig, Catalog, CatalogStack, DataKind, DataSpec, Error, Opened};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/julia")
}

fn cache(dir: &TempDir) -> std::sync::Arc<Cache> {
    Cache::open(CacheConfig::new(dir.path().join("cache"))).unwrap()
}

/// The names of a list file: one a line, `#` lines skipped, `\s`, `\t` and `\uXXXX` unescaped.
fn names(file: &str) -> Vec<String> {
    let text = std::fs::read_to_string(fixtures().join(file)).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(unescape)
        .collect()
}

fn unescape(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('s') => out.push(' '),
            Some('t') => out.push('\t'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                out.push(char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap());
            }
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[test]
fn every_name_datasets_jl_accepts_is_accepted_and_alone_is_a_spec() {
    let valid = names("names-valid.txt");
    assert!(valid.len() > 20);
    for name in valid {
        for n in [
            name.clone(),
            format!("foo/{name}"),
            format!("{name}/foo"),
            format!("foo/{name}/bar"),
        ] {
            check_name(&n).unwrap_or_else(|e| panic!("{n:?}: {e}"));
            let spec = DataSpec::parse(&n).unwrap_or_else(|e| panic!("{n:?}: {e}"));
            assert_eq!((spec.name.as_str(), spec.is_bare()), (n.as_str(), true));
        }
    }
}

#[test]
fn every_name_datasets_jl_rejects_is_rejected_and_is_no_spec() {
    let invalid = names("names-invalid.txt");
    assert!(invalid.len() > 30);
    for name in invalid {
        for n in [
            name.clone(),
            format!("foo/{name}"),
            format!("{name}/foo"),
            format!("foo/{name}/bar"),
        ] {
            let e = check_name(&n).expect_err(&n);
            assert!(e.contains("is not a valid dataset name"), "{e}");
            // A name with '#' or '?' may still be a spec (a name and a fragment or query); all others fail.
            if !n.contains(['#', '?']) {
                let e = DataSpec::parse(&n).expect_err(&n).to_string();
                assert!(e.starts_with("invalid dataset specification"), "{e}");
            }
        }
    }
}

#[test]
fn specs_parse_as_datasets_jl_parses_them() {
    let text = std::fs::read_to_string(fixtures().join("specs.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() > 30);
    for case in cases {
        let spec = case["spec"].as_str().unwrap();
        let got = DataSpec::parse(spec);
        if case.get("error").is_some() {
            let e = got.expect_err(spec).to_string();
            assert!(e.starts_with("invalid dataset specification"), "{spec:?}: {e}");
            assert!(e.contains(&format!("{spec:?}")), "the error names the spec: {e}");
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{spec:?}: {e}"));
        assert_eq!(got.name, case["name"].as_str().unwrap(), "{spec:?}");
        let query = got
            .query
            .map(|q| serde_json::to_value(q).unwrap())
            .unwrap_or(serde_json::Value::Null);
        assert_eq!(query, case["query"], "{spec:?}");
        assert_eq!(got.fragment.as_deref(), case["fragment"].as_str(), "{spec:?}");
    }
}

#[tokio::test]
async fn a_version_0_catalog_loads_and_other_versions_are_named() {
    let tmp = TempDir::new("v0");
    let catalog = Catalog::load(fixtures().join("Version0.toml"), cache(&tmp)).unwrap();
    let blob = catalog.blob("a_text_file").unwrap();
    assert_eq!(&blob.read_all().await.unwrap()[..], b"Hello world!\n");
    for (version, shown) in [("2", "2"), ("-1", "-1"), ("\"1\"", "\"1\"")] {
        let text = format!("data_config_version = {version}\n");
        let e = Catalog::parse(&text, fixtures().join("x.toml"), cache(&tmp))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("data_config_version is {shown}")) && e.contains("versions 0 and 1"),
            "{e}"
        );
    }
}

#[tokio::test]
async fn a_dataset_with_an_invalid_name_is_listed_and_cannot_be_opened() {
    let tmp = TempDir::new("names");
    let catalog = Catalog::load(fixtures().join("Names.toml"), cache(&tmp)).unwrap();
    let listed: Vec<(&str, bool)> = catalog
        .datasets()
        .iter()
        .map(|d| (d.name(), d.invalid_name().is_some()))
        .collect();
    assert_eq!(listed, [("good_name", false), ("bad name", true), ("a#b", true)]);
    assert_eq!(
        &catalog.blob("good_name").unwrap().read_all().await.unwrap()[..],
        b"Hello world!\n"
    );
    // By name: "bad name" is no spec; "a#b" is the spec of a dataset "a" (none) with a fragment.
    let e = catalog.dataset("bad name").unwrap_err();
    assert!(matches!(e, Error::InvalidSpec(_)), "{e}");
    assert!(matches!(
        catalog.dataset("a#b").unwrap_err(),
        Error::NoSuchDataset { .. }
    ));
    // By uuid: found, and refused with the rule.
    let e = catalog
        .blob("0c2a4d1e-5b7f-4c3a-9e8d-1f2a3b4c5d62")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"bad name\"") && e.contains("cannot be opened") && e.contains("DataSets.jl's rule"),
        "{e}"
    );
}

#[tokio::test]
async fn open_gives_a_blob_or_a_tree_and_a_fragment_selects_in_a_tree() {
    let tmp = TempDir::new("open");
    let catalog = Catalog::load(fixtures().join("Data.toml"), cache(&tmp)).unwrap();
    let Opened::Blob(text) = catalog.open("a_text_file").await.unwrap() else {
        panic!("a blob")
    };
    assert_eq!(&text.read_all().await.unwrap()[..], b"Hello world!\n");
    let Opened::Tree(tree) = catalog.open("a_tree_example").await.unwrap() else {
        panic!("a tree")
    };
    let files: Vec<String> = tree.list().await.unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(files, ["1.csv", "2.csv"]);
    let Opened::Blob(csv) = catalog.open("a_tree_example#1.csv").await.unwrap() else {
        panic!("a blob")
    };
    assert_eq!(
        &csv.read_all().await.unwrap()[..],
        b"Name,Age\n\"Aaron\",23\n\"Beth\",45\n"
    );
    assert_eq!(
        csv.tag().path,
        "1.csv",
        "a handle sent on carries the path the spec selected"
    );
    let sel = catalog.dataset("a_tree_example?x=1&y%20y=2#1.csv").unwrap();
    assert_eq!(sel.name(), "a_tree_example");
    assert_eq!(sel.query().unwrap().get("y y").map(String::as_str), Some("2"));
    assert_eq!(sel.fragment(), Some("1.csv"));

    let e = catalog.open("a_tree_example#3.csv").await.unwrap_err().to_string();
    assert!(e.contains("\"3.csv\"") && e.contains("1.csv, 2.csv"), "{e}");
    let e = catalog.open("a_tree_example#1.csv/x").await.unwrap_err().to_string();
    assert!(e.contains("\"1.csv/x\""), "{e}");
    let e = catalog.open("a_text_file#x").await.unwrap_err().to_string();
    assert!(e.contains("is a Blob") && e.contains("#x"), "{e}");
    let e = catalog
        .open("a_tree_example#../Data.toml")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("leaves the tree"), "{e}");
    let e = catalog.open("a text file").await.unwrap_err().to_string();
    assert!(e.starts_with("invalid dataset specification \"a text file\""), "{e}");
}

#[tokio::test]
async fn a_stack_resolves_names_in_order() {
    let tmp = TempDir::new("stack");
    let first = fixtures().join("stack");
    let second = fixtures().join("Data.toml");
    let stack = CatalogStack::load(&[first.clone(), second.clone()], cache(&tmp)).unwrap();
    // The first catalog that has a name answers; the second's dataset of that name is shadowed.
    let sel = stack.dataset("a_text_file").unwrap();
    assert_eq!(sel.uuid(), "314996ef-12be-40d0-912c-9755af354fdb");
    assert_eq!(
        &stack.blob("a_text_file").unwrap().read_all().await.unwrap()[..],
        b"From the first catalog\n"
    );
    assert_eq!(
        stack.dataset("some_namespace/a_text_file").unwrap().uuid(),
        "b498f769-a7f6-4f67-8d74-40b770398f27"
    );
    let shadowed: Vec<(String, bool)> = stack
        .entries()
        .into_iter()
        .map(|e| (e.dataset.name().to_string(), e.shadowed_by.is_some()))
        .filter(|(n, _)| n == "a_text_file")
        .collect();
    assert_eq!(
        shadowed,
        [("a_text_file".to_string(), false), ("a_text_file".to_string(), true)]
    );
    // A fragment into a folder of a tree gives the folder; one into a file in it, the file.
    let Opened::Tree(sub) = stack.open("nested_tree#sub").await.unwrap() else {
        panic!("a tree")
    };
    assert_eq!(sub.path(), "sub");
    let Opened::Blob(csv) = stack.open("nested_tree#sub/3.csv").await.unwrap() else {
        panic!("a blob")
    };
    assert_eq!(&csv.read_all().await.unwrap()[..], b"Name,Age\n\"Zed\",7\n");
    let e = stack.dataset("nowhere").unwrap_err().to_string();
    assert!(
        e.contains("\"nowhere\"") && e.contains("only_in_first") && e.contains("a_tree_example"),
        "{e}"
    );
    // In the other order, the other catalog's dataset answers.
    let reversed = CatalogStack::load(&[second, first], cache(&tmp)).unwrap();
    assert_eq!(
        reversed.dataset("a_text_file").unwrap().uuid(),
        "b498f769-a7f6-4f67-8d74-40b770398f26"
    );
    assert_eq!(
        reversed
            .open("a_tree_example")
            .await
            .unwrap()
            .into_tree()
            .unwrap()
            .dataset()
            .kind(),
        DataKind::BlobTree
    );
}

#[test]
fn a_path_list_is_split_as_julia_splits_it() {
    let paths = CatalogStack::paths_of("/a/Data.toml:/b");
    assert_eq!(paths, [PathBuf::from("/a/Data.toml"), PathBuf::from("/b")]);
    // An empty entry is ~/.julia/datasets/Data.toml, skipped where it does not exist.
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap();
    let default = home.join(".julia/datasets/Data.toml");
    let got = CatalogStack::paths_of(":/b");
    assert_eq!(got.contains(&default), default.exists());
    assert_eq!(got.last(), Some(&PathBuf::from("/b")));
}
