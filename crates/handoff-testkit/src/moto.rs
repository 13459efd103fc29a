//! moto in server mode: a real S3-compatible server (Python, from PyPI) started as a child process on loopback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What to do when moto is missing.
pub const MOTO_INSTALL_HINT: &str = "moto (the S3-compatible test server) is needed: run ./scripts/test, which \
     installs it into .venv; or `python3 -m venv .venv && .venv/bin/python -m pip install 'moto[s3]' flask flask-cors`; \
     or set HANDOFF_MOTO_PYTHON to a python that has moto";

/// A moto S3 server on 127.0.0.1; killed when dropped. Credentials: any key id and secret, e.g. `test`/`test`.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl MotoServer {
    /// The python that has moto: `$HANDOFF_MOTO_PYTHON`, else `.venv/bin/python` in the current folder or one
    /// above it, else the workspace's `.venv`.
    pub fn find_python() -> Result<PathBuf, String> {
        if let Some(p) = std::env::var_os("HANDOFF_MOTO_PYTHON") {
            return Ok(p.into());
        }
        let mut candidates = Vec::new();
        if let Ok(cwd) = std::env::current_dir() {
            candidates.extend(cwd.ancestors().map(|d| d.join(".venv/bin/python")));
        }
        candidates.push(PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../.venv/bin/python"
        )));
        candidates
            .into_iter()
            .find(|p| p.exists())
            .ok_or_else(|| format!("no .venv/bin/python found. {MOTO_INSTALL_HINT}"))
    }

    /// Starts moto on a free loopback port and waits until it answers.
    pub async fn start() -> Result<MotoServer, String> {
        let python = Self::find_python()?;
        let mut last = String::new();
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("no free port: {e}"))?
                .port();
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let log = std::env::temp_dir().join(format!("handoff-moto-{}-{port}.log", std::process::id()));
            let out = std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
            let err = out.try_clone().map_err(|e| e.to_string())?;
            let child = Command::new(&python)
                .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .map_err(|e| format!("cannot run {}: {e}. {MOTO_INSTALL_HINT}", python.display()))?;
            let mut server = MotoServer { child, addr, log };
            match server.wait_ready(Duration::from_secs(30)).await {
                Ok(()) => return Ok(server),
                Err(e) => last = e, // port taken meanwhile, or moto missing: the message says which
            }
            if last.contains("No module named") {
                break;
            }
        }
        Err(last)
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: String = log
                    .lines()
                    .rev()
                    .take(5)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                let hint = if log.contains("No module named") {
                    MOTO_INSTALL_HINT
                } else {
                    ""
                };
                return Err(format!("moto exited ({status}) before answering:\n{tail}\n{hint}"));
            }
            if self.request("GET", "/moto-api/data.json").await.is_ok_and(|s| s == 200) {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(format!("moto did not answer on {} within {limit:?}", self.addr));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends a bare request and returns the status code.
    async fn request(&self, method: &str, path: &str) -> std::io::Result<u16> {
        let mut s = tokio::net::TcpStream::connect(self.addr).await?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.addr
        );
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        let text = String::from_utf8_lossy(&buf);
        text.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no HTTP status"))
    }

    /// Creates a bucket.
    pub async fn create_bucket(&self, name: &str) -> Result<(), String> {
        match self.request("PUT", &format!("/{name}")).await {
            Ok(200) => Ok(()),
            Ok(code) => Err(format!("moto answered {code} to creating bucket {name}")),
            Err(e) => Err(format!("cannot create bucket {name}: {e}")),
        }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
