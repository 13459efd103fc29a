//! A small HTTP/1.1 file server: GET (with Range and If-Match), HEAD (Content-Length, ETag, Last-Modified),
//! PUT (creating folders) and PROPFIND (Depth 1 or infinity) over a local folder — what `object_store`'s HTTP store
//! needs. It counts every request.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::counter::RequestCounter;
use super::wire::{read_head, RequestHead};

/// An HTTP file server on 127.0.0.1, serving `root`; stopped when dropped.
#[derive(Debug)]
pub struct HttpFileServer {
    addr: SocketAddr,
    root: PathBuf,
    counter: RequestCounter,
    delay_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpFileServer {
    /// Starts serving `root` (created if missing) on a free loopback port.
    pub async fn start(root: impl Into<PathBuf>) -> std::io::Result<HttpFileServer> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counter = RequestCounter::default();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (r, c, d) = (root.clone(), counter.clone(), delay_ms.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (r, c, d) = (r.clone(), c.clone(), d.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, &r, &c, &d).await;
                });
            }
        });
        Ok(HttpFileServer {
            addr,
            root,
            counter,
            delay_ms,
            task,
        })
    }

    /// Delays every GET response by `delay` (to make concurrent requesters overlap in tests).
    pub fn set_get_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The folder served.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The request counter.
    pub fn counter(&self) -> &RequestCounter {
        &self.counter
    }
}

impl Drop for HttpFileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn etag(meta: &std::fs::Metadata) -> String {
    format!("\"{:x}-{:x}-{:x}\"", meta.len(), meta.mtime(), meta.mtime_nsec())
}

fn decode(target: &str) -> Option<String> {
    let path = target.split('?').next()?;
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let h = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(out).ok()?;
    if s.split('/').any(|p| p == "..") {
        return None;
    }
    Some(s.trim_start_matches('/').to_string())
}

async fn respond(
    w: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-length")) {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    w.write_all(out.as_bytes()).await?;
    if !head_only {
        w.write_all(body).await?;
    }
    Ok(())
}

async fn serve(stream: TcpStream, root: &Path, counter: &RequestCounter, delay: &AtomicU64) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    while let Some(head) = read_head(&mut reader).await? {
        counter.record(&head.method, &head.target);
        let mut body = Vec::new();
        if head.chunked() {
            respond(reader.get_mut(), "411 Length Required", &[], b"", false).await?;
            return Ok(());
        }
        let n = head.content_length();
        if n > 0 {
            (&mut reader).take(n).read_to_end(&mut body).await?;
        }
        let ms = delay.load(Ordering::Relaxed);
        if ms > 0 && head.method == "GET" {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        handle(&mut reader, &head, body, root, counter).await?;
    }
    Ok(())
}

async fn handle(
    reader: &mut BufReader<TcpStream>,
    head: &RequestHead,
    body: Vec<u8>,
    root: &Path,
    counter: &RequestCounter,
) -> std::io::Result<()> {
    let w = reader.get_mut();
    let Some(rel) = decode(&head.target) else {
        return respond(w, "400 Bad Request", &[], b"bad path", false).await;
    };
    let path = root.join(&rel);
    match head.method.as_str() {
        "GET" | "HEAD" => {
            let head_only = head.method == "HEAD";
            let meta = match tokio::fs::metadata(&path).await {
                Ok(m) if m.is_file() => m,
                _ => return respond(w, "404 Not Found", &[], b"not found", head_only).await,
            };
            let tag = etag(&meta);
            if let Some(m) = head.header("if-match") {
                if m != "*" && !m.split(',').any(|x| x.trim() == tag) {
                    return respond(w, "412 Precondition Failed", &[], b"", head_only).await;
                }
            }
            let size = meta.len();
            let modified = super::httpdate::format(meta.modified()?);
            let mut headers = vec![
                ("ETag", tag),
                ("Last-Modified", modified),
                ("Accept-Ranges", "bytes".to_string()),
            ];
            let range = head.header("range").and_then(|r| parse_range(r, size));
            let (status, start, end) = match range {
                Some((s, e)) => {
                    headers.push(("Content-Range", format!("bytes {s}-{}/{size}", e - 1)));
                    ("206 Partial Content", s, e)
                }
                None if head.header("range").is_some() => {
                    let h = [("Content-Range", format!("bytes */{size}"))];
                    return respond(w, "416 Range Not Satisfiable", &h, b"", head_only).await;
                }
                None => ("200 OK", 0, size),
            };
            headers.push(("Content-Length", (end - start).to_string()));
            let data = if head_only {
                Vec::new()
            } else {
                let mut f = tokio::fs::File::open(&path).await?;
                use tokio::io::AsyncSeekExt;
                f.seek(std::io::SeekFrom::Start(start)).await?;
                let mut buf = vec![0u8; (end - start) as usize];
                f.read_exact(&mut buf).await?;
                counter.add_bytes(buf.len() as u64);
                buf
            };
            respond(w, status, &headers, &data, head_only).await
        }
        "PUT" => {
            if let Some(parent) = path.parent() {
                tokio::fs::create_dir_all(parent).await?;
            }
            let tmp = path.with_extension("uploading");
            tokio::fs::write(&tmp, &body).await?;
            tokio::fs::rename(&tmp, &path).await?;
            respond(w, "201 Created", &[], b"", false).await
        }
        "MKCOL" => {
            tokio::fs::create_dir_all(&path).await?;
            respond(w, "201 Created", &[], b"", false).await
        }
        "DELETE" => match tokio::fs::remove_file(&path).await {
            Ok(()) => respond(w, "204 No Content", &[], b"", false).await,
            Err(_) => respond(w, "404 Not Found", &[], b"", false).await,
        },
        "PROPFIND" => {
            let depth = head.header("depth").unwrap_or("infinity").to_string();
            match propfind(root, &rel, &depth) {
                Some(xml) => {
                    let h = [("Content-Type", "application/xml; charset=utf-8".to_string())];
                    respond(w, "207 Multi-Status", &h, xml.as_bytes(), false).await
                }
                None => respond(w, "404 Not Found", &[], b"", false).await,
            }
        }
        _ => respond(w, "405 Method Not Allowed", &[], b"", false).await,
    }
}

/// `bytes=a-b`, `bytes=a-`, `bytes=-n` → the half-open range, if satisfiable.
fn parse_range(h: &str, size: u64) -> Option<(u64, u64)> {
    let spec = h.trim().strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().ok()?;
            (size.saturating_sub(n), size)
        }
        (a, "") => (a.parse().ok()?, size),
        (a, b) => (a.parse().ok()?, b.parse::<u64>().ok()?.saturating_add(1).min(size)),
    };
    (start < end && start < size).then_some((start, end))
}

fn propfind(root: &Path, rel: &str, depth: &str) -> Option<String> {
    let base = root.join(rel);
    let meta = std::fs::metadata(&base).ok()?;
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<multistatus xmlns=\"DAV:\">\n");
    let entry = |out: &mut String, href: &str, m: &std::fs::Metadata| {
        let modified = super::httpdate::format(m.modified().unwrap_or(std::time::UNIX_EPOCH));
        let (kind, len) = if m.is_dir() {
            ("<resourcetype><collection/></resourcetype>".to_string(), String::new())
        } else {
            (
                "<resourcetype/>".to_string(),
                format!(
                    "<getcontentlength>{}</getcontentlength><getetag>{}</getetag>",
                    m.len(),
                    etag(m)
                ),
            )
        };
        out.push_str(&format!(
            "<response><href>/{href}</href><propstat><prop><getlastmodified>{modified}</getlastmodified>{len}{kind}</prop>\
             <status>HTTP/1.1 200 OK</status></propstat></response>\n"
        ));
    };
    entry(&mut out, rel, &meta);
    if meta.is_dir() && depth != "0" {
        let mut stack = vec![(base, rel.trim_end_matches('/').to_string())];
        while let Some((dir, prefix)) = stack.pop() {
            for e in std::fs::read_dir(&dir).ok()?.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".uploading") {
                    continue;
                }
                let href = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                };
                let Ok(m) = e.metadata() else { continue };
                entry(&mut out, &href, &m);
                if m.is_dir() && depth == "infinity" {
                    stack.push((e.path(), href));
                }
            }
        }
    }
    out.push_str("</multistatus>\n");
    Some(out)
}
