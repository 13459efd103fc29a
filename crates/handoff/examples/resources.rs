//! A user-defined resource type: a connection pool that cannot travel. A message refers to
//! it as `Resource<Pool>`; on the wire it is the key `"warehouse"`, and the receiving node
//! binds the key to *its own* pool — registered up front, or opened on demand by a resolver.
//!
//! Run: `cargo run -p handoff --example resources`

use std::sync::Arc;

use handoff::wire::resource::AnyResource;
use handoff::{Message, Node, Resolver, Resource};
use serde::{Deserialize, Serialize};

/// Something local to a node: here, a pool of database connections.
struct Pool {
    node: String,
    url: String,
}

impl Pool {
    fn query(&self, sql: &str) -> String {
        format!("{} ran {sql:?} on {}", self.node, self.url)
    }
}

/// A task that refers to a pool by key.
#[derive(Serialize, Deserialize)]
struct Task {
    sql: String,
    db: Resource<Pool>,
}
impl Message for Task {
    const TYPE_NAME: &'static str = "example.Task";
}

/// Opens pools named `pool:<db>` on first use.
struct PoolOpener {
    node: String,
}
impl Resolver for PoolOpener {
    fn resolve(&self, key: &str) -> Option<Result<AnyResource, String>> {
        let db = key.strip_prefix("pool:")?;
        Some(Ok(Arc::new(Pool {
            node: self.node.clone(),
            url: format!("postgres://localhost/{db}"),
        })))
    }
    fn keys(&self) -> Vec<String> {
        vec!["pool:<db>".into()]
    }
}

#[tokio::main]
async fn main() -> handoff::Result<()> {
    let sender = Node::builder("scheduler").secret("example").build().await?;
    let worker = Node::builder("worker")
        .secret("example")
        .listen("127.0.0.1:0")
        .register::<Task>()
        .build()
        .await?;
    // The worker's own objects: one registered pool and a resolver for the rest.
    worker.resources().insert(
        "warehouse",
        Arc::new(Pool {
            node: "worker".into(),
            url: "postgres://db-near-worker/warehouse".into(),
        }),
    );
    worker
        .resources()
        .add_resolver(Arc::new(PoolOpener { node: "worker".into() }));

    let mine = Arc::new(Pool {
        node: "scheduler".into(),
        url: "postgres://db-near-scheduler/warehouse".into(),
    });
    let peer = sender.connect(worker.listen_addr().expect("listens")).await?;
    for key in ["warehouse", "pool:metrics", "unknown"] {
        peer.send(Task {
            sql: "select count(*) from orders".into(),
            db: Resource::new(key, mine.clone()),
        })
        .await?;
        match worker.recv().await?.decode::<Task>() {
            Ok(task) => println!("{}", task.db.query(&task.sql)),
            Err(e) => println!("refused: {e}"),
        }
    }
    Ok(())
}
