//! A TCP proxy that counts the HTTP requests passing through it (how tests count storage GETs of a server that
//! has no counter of its own, such as moto).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::counter::RequestCounter;
use super::wire::read_head;

/// A counting proxy on 127.0.0.1 in front of `upstream`; stopped when dropped.
#[derive(Debug)]
pub struct CountingProxy {
    addr: SocketAddr,
    counter: RequestCounter,
    task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    /// Starts a proxy to `upstream` on a free loopback port.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<CountingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counter = RequestCounter::default();
        let c = counter.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    let _ = relay(client, upstream, &c).await;
                });
            }
        });
        Ok(CountingProxy { addr, counter, task })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The request counter.
    pub fn counter(&self) -> &RequestCounter {
        &self.counter
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, counter: &RequestCounter) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    let (cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        let _ = cw.shutdown().await;
    });
    let mut reader = BufReader::new(cr);
    let result = async {
        while let Some(head) = read_head(&mut reader).await? {
            counter.record(&head.method, &head.target);
            sw.write_all(&head.raw).await?;
            if head.chunked() {
                // Not parsed: pass the rest of the connection through uncounted.
                tokio::io::copy(&mut reader, &mut sw).await?;
                break;
            }
            let n = head.content_length();
            if n > 0 {
                let copied = tokio::io::copy(&mut (&mut reader).take(n), &mut sw).await?;
                if copied != n {
                    break;
                }
            }
        }
        Ok::<_, std::io::Error>(())
    }
    .await;
    let _ = sw.shutdown().await;
    let _ = back.await;
    result
}
