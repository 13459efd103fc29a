//! Resources: a value that refers to a node-local object travels as its key and binds to
//! the receiver's own object; unknown keys fail with the key and the keys the node has.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use handoff::{Error, Message, Node, Resolver, Resource, ResourceError, WireError};
use serde::{Deserialize, Serialize};

const SECRET: &str = "test-secret";
const T: Duration = Duration::from_secs(10);

/// A user's own resource type: something that cannot travel (here, it names its node).
#[derive(Debug)]
struct Pool {
    owner: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Query {
    sql: String,
    pool: Resource<Pool>,
}
impl Message for Query {
    const TYPE_NAME: &'static str = "test.Query";
}

/// Two nodes, `{tag}-a` connecting to `{tag}-b` over TCP (names are unique per process).
async fn pair(tag: &str) -> (Node, Node) {
    let a = Node::builder(format!("{tag}-a")).secret(SECRET).build().await.unwrap();
    let b = Node::builder(format!("{tag}-b"))
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .register::<Query>()
        .build()
        .await
        .unwrap();
    (a, b)
}

fn query(key: &str) -> Query {
    Query {
        sql: "select 1".into(),
        pool: Resource::new(key, Arc::new(Pool { owner: "a".into() })),
    }
}

#[tokio::test]
async fn a_resource_binds_to_the_receivers_object() {
    let (a, b) = pair("bind").await;
    b.resources().insert("db", Arc::new(Pool { owner: "b".into() }));
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(query("db")).await.unwrap();
    let got: Query = tokio::time::timeout(T, b.recv())
        .await
        .unwrap()
        .unwrap()
        .decode()
        .unwrap();
    assert_eq!(got.sql, "select 1");
    assert_eq!(got.pool.key(), "db");
    assert_eq!(
        got.pool.owner, "b",
        "bound to the receiver's pool, not a copy of the sender's"
    );
}

#[tokio::test]
async fn an_unknown_key_names_the_key_and_the_keys_the_node_has() {
    let (a, b) = pair("unknown").await;
    b.resources().insert("cache", Arc::new(Pool { owner: "b".into() }));
    b.resources().insert("db-main", Arc::new(Pool { owner: "b".into() }));
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(query("db")).await.unwrap();
    let err = tokio::time::timeout(T, b.recv())
        .await
        .unwrap()
        .unwrap()
        .decode::<Query>()
        .unwrap_err();
    let Error::Wire(WireError::UnknownResource(ResourceError::Unknown { key, node, available })) = &err else {
        panic!("expected unknown-resource, got {err:?}");
    };
    assert_eq!((key.as_str(), node.as_str()), ("db", "unknown-b"));
    assert_eq!(available, &["cache".to_string(), "db-main".to_string()]);
    let text = err.to_string();
    assert!(text.contains("\"db\"") && text.contains("cache, db-main"), "{text}");

    // The node keeps serving: the same connection still delivers.
    b.resources().insert("db", Arc::new(Pool { owner: "b".into() }));
    peer.send(query("db")).await.unwrap();
    let got: Query = tokio::time::timeout(T, b.recv())
        .await
        .unwrap()
        .unwrap()
        .decode()
        .unwrap();
    assert_eq!(got.pool.owner, "b");
}

#[tokio::test]
async fn a_key_of_another_type_is_refused() {
    let (a, b) = pair("type").await;
    b.resources().insert("db", Arc::new(String::from("not a pool")));
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(query("db")).await.unwrap();
    let err = b.recv().await.unwrap().decode::<Query>().unwrap_err();
    assert!(
        matches!(&err, Error::Wire(WireError::UnknownResource(ResourceError::WrongType { key, .. })) if key == "db"),
        "{err:?}"
    );
}

/// Opens pools on demand for keys `pool:NAME`, counting how often.
struct OpenPools {
    opened: AtomicUsize,
}
impl Resolver for OpenPools {
    fn resolve(&self, key: &str) -> Option<Result<handoff::wire::resource::AnyResource, String>> {
        let name = key.strip_prefix("pool:")?;
        if name == "broken" {
            return Some(Err("the database refused the connection".into()));
        }
        self.opened.fetch_add(1, Ordering::SeqCst);
        Some(Ok(Arc::new(Pool {
            owner: format!("b/{name}"),
        })))
    }
    fn keys(&self) -> Vec<String> {
        vec!["pool:*".into()]
    }
}

#[tokio::test]
async fn a_resolver_opens_resources_on_demand() {
    let (a, b) = pair("resolver").await;
    let resolver = Arc::new(OpenPools {
        opened: AtomicUsize::new(0),
    });
    b.resources().add_resolver(resolver.clone());
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(query("pool:reports")).await.unwrap();
    let got: Query = b.recv().await.unwrap().decode().unwrap();
    assert_eq!(got.pool.owner, "b/reports");
    assert_eq!(resolver.opened.load(Ordering::SeqCst), 1);

    peer.send(query("pool:broken")).await.unwrap();
    let err = b.recv().await.unwrap().decode::<Query>().unwrap_err();
    assert!(err.to_string().contains("refused the connection"), "{err}");

    peer.send(query("other")).await.unwrap();
    let err = b.recv().await.unwrap().decode::<Query>().unwrap_err();
    assert!(
        err.to_string().contains("pool:*"),
        "the resolver's keys are listed: {err}"
    );
}

#[tokio::test]
async fn in_one_process_the_value_moves_with_its_resource() {
    let a = Node::builder("a-in").secret(SECRET).build().await.unwrap();
    let b = Node::builder("b-in")
        .secret(SECRET)
        .register::<Query>()
        .build()
        .await
        .unwrap();
    let peer = a.connect(&b.inproc_addr()).await.unwrap();
    peer.send(query("db")).await.unwrap();
    let got: Query = b.recv().await.unwrap().decode().unwrap();
    assert_eq!(
        got.pool.owner, "a",
        "nothing was serialized: the sender's own object arrived"
    );
}
