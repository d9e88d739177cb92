//! Private Redis servers for tests: a standalone [`RedisServer`], a
//! six-node [`RedisCluster`] and a Sentinel group ([`RedisSentinel`]), on
//! free loopback ports, without persistence, killed on drop and when the
//! test process dies. Never port 6379. [`FaultProxy`] sits between a client
//! and such a server to inject network faults.
//!
//! A dev-dependency only: no crate ships it (`.ci/architecture` checks).

mod cluster;
mod proxy;
mod sentinel;

pub use cluster::{ClusterNode, NODE_TIMEOUT, RedisCluster};
pub use proxy::{FaultProxy, ProxyMode, ReplyFault, SEED_VARIABLE, SeededRng};
pub use sentinel::{DOWN_AFTER, MASTER_NAME, RedisSentinel};

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a starting server may take to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` process owned by a test.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    /// Arguments before the standalone defaults (a sentinel's config file,
    /// which must come first).
    leading_args: Vec<String>,
    /// Arguments beyond the standalone defaults (a cluster node's options).
    extra_args: Vec<String>,
    dir: tempfile::TempDir,
    /// The process id while [`Self::pause`] has it frozen.
    paused: Option<String>,
}

impl RedisServer {
    /// Spawns `redis-server` on a free loopback port with `--save ""` and
    /// `--appendonly no`, and waits until it answers `PING`.
    ///
    /// # Panics
    /// When `redis-server` is not on PATH or does not come up; the message
    /// says which, with the server log.
    pub fn start() -> Self {
        Self::start_with(|_, _| Vec::new())
    }

    /// Like [`Self::start`], with `args` appended to the command line (e.g.
    /// `["--maxmemory-policy", "allkeys-lru"]`); they hold across
    /// [`Self::restart`].
    pub fn start_with_args(args: &[&str]) -> Self {
        let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
        Self::start_with(move |_, _| args.clone())
    }

    /// Like [`Self::start`], with its users read from an ACL file holding
    /// `users`, one `user <name> <rules>...` line each (e.g.
    /// `user default off` to disable the default user). The server counts
    /// as up when it answers `PING` or refuses it with `NOAUTH`.
    ///
    /// # Panics
    /// As [`Self::start`]; also when Redis rejects the ACL file (see the log).
    pub fn start_with_acl(users: &[String]) -> Self {
        let mut file = users.join("\n");
        file.push('\n');
        Self::start_with(move |_, dir| {
            let path = dir.join("users.acl");
            std::fs::write(&path, &file).expect("write the ACL file");
            vec!["--aclfile".to_owned(), path.display().to_string()]
        })
    }

    /// Like [`Self::start`], with `extra_args(port, dir)` appended to the
    /// command line (asked again for every port tried; `dir` is the server's
    /// own temp dir, for files the arguments name).
    pub(crate) fn start_with(extra_args: impl Fn(u16, &Path) -> Vec<String>) -> Self {
        Self::start_with_leading(|_, _| Vec::new(), extra_args)
    }

    /// Like [`Self::start_with`], with `leading_args(port, dir)` before
    /// every other argument (a config file must be the first).
    pub(crate) fn start_with_leading(
        leading_args: impl Fn(u16, &Path) -> Vec<String>,
        extra_args: impl Fn(u16, &Path) -> Vec<String>,
    ) -> Self {
        assert!(
            on_path("redis-server"),
            "redis-server is not on PATH: install Redis (e.g. `apt-get install redis-server`) \
             to run the Redis provider's tests"
        );
        let dir = tempfile::tempdir().expect("create a temp dir for redis-server");
        let mut server = Self {
            child: None,
            port: 0,
            leading_args: Vec::new(),
            extra_args: Vec::new(),
            dir,
            paused: None,
        };
        for _ in 0..5 {
            server.port = free_port();
            server.leading_args = leading_args(server.port, server.dir.path());
            server.extra_args = extra_args(server.port, server.dir.path());
            if server.spawn() {
                return server;
            }
            // Most likely another process took the port between probe and bind.
            server.stop();
        }
        panic!("redis-server did not start after 5 attempts:\n{}", server.log());
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the server was started and not stopped since.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Freezes the server with `SIGSTOP`: its connections stay open and
    /// nothing answers, as with a blackholed server. Undone by
    /// [`Self::resume`] (and by stopping or dropping the server).
    ///
    /// # Panics
    /// When the server does not tell its process id (its default user must
    /// be on) or cannot be signalled.
    pub fn pause(&mut self) {
        if self.paused.is_some() {
            return;
        }
        let pid = self.process_id();
        signal("-STOP", &pid);
        self.paused = Some(pid);
    }

    /// The server's process id, as it tells it (`INFO server`).
    fn process_id(&self) -> String {
        let info = cluster::cli(self.port, &["INFO", "server"]);
        info.lines()
            .find_map(|line| line.trim().strip_prefix("process_id:"))
            .unwrap_or_else(|| panic!("server {} did not tell its process id: {info}", self.port))
            .to_owned()
    }

    /// Lets a [`Self::pause`]d server run again. Idempotent.
    ///
    /// # Panics
    /// When the server cannot be signalled.
    pub fn resume(&mut self) {
        if let Some(pid) = self.paused.take() {
            signal("-CONT", &pid);
        }
    }

    /// Kills the server and waits for it to exit. Idempotent.
    pub fn stop(&mut self) {
        // A frozen process would never act on the kill.
        self.resume();
        if let Some(mut child) = self.child.take() {
            // Closing stdin makes the shell parent kill redis-server; then the
            // shell exits and is reaped here.
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }

    /// Crashes the server with `SIGKILL`: no goodbye to its replicas or
    /// clients, as in a real crash. Idempotent.
    ///
    /// # Panics
    /// When the server does not tell its process id or cannot be killed.
    pub fn crash(&mut self) {
        if !self.is_running() {
            return;
        }
        self.resume();
        let pid = self.process_id();
        signal("-KILL", &pid);
        // Reaps the shell parent, which exits with the server.
        self.stop();
    }

    /// Stops and starts the server again on the same port (empty data).
    ///
    /// # Panics
    /// When it does not come back.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + START_TIMEOUT;
        // The old socket may linger for a moment; retry until the port binds.
        while !self.spawn() {
            self.stop();
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Spawns and waits for `PING`; false when the process exited early.
    fn spawn(&mut self) -> bool {
        assert_ne!(self.port, 6379, "tests never use the default Redis port");
        // A small shell parent kills redis-server as soon as our end of its
        // stdin closes, so a server held in a `static` (whose Drop never
        // runs) still dies with the test process. The shell exits when
        // redis-server does, so an early exit shows in `try_wait`.
        let spawned = Command::new("sh")
            .arg("-c")
            .arg(
                "exec 3<&0; redis-server \"$@\" </dev/null & pid=$!; \
                 (read -r _ <&3; kill $pid 2>/dev/null) & watcher=$!; \
                 wait $pid; status=$?; kill $watcher 2>/dev/null; exit $status",
            )
            .arg("redis-fixture")
            .args(&self.leading_args)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(error) => panic!("could not spawn sh for redis-server: {error}"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if answers(self.port) {
                return true;
            }
            if let Some(child) = self.child.as_mut() {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return false;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not answer PING:\n{}", self.port, self.log());
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn signal(signal: &str, pid: &str) {
    let sent = Command::new("kill").args([signal, pid]).status().expect("run kill");
    assert!(sent.success(), "kill {signal} {pid} failed");
}

pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

pub(crate) fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a probe socket");
        let port = listener.local_addr().expect("probe address").port();
        if port != 6379 {
            return port;
        }
    }
}

/// Whether the server on `port` is up: it answers `PING` with `PONG`, or
/// refuses it with `NOAUTH` (the default user needs a password or is off).
fn answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut answer = [0_u8; 7];
    let up = stream.read_exact(&mut answer).is_ok()
        && (&answer == b"+PONG\r\n" || answer.starts_with(b"-NOAUTH"));
    let _ = stream.shutdown(Shutdown::Both);
    up
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_programs_on_path_only() {
        assert!(on_path("sh"));
        assert!(!on_path("no-such-program-ca-skeleton"));
    }

    #[test]
    fn a_server_answers_stops_and_comes_back_on_the_same_port() {
        let mut server = RedisServer::start();
        let port = server.port();
        assert_ne!(port, 6379);
        assert_eq!(server.url(), format!("redis://127.0.0.1:{port}"));
        assert!(answers(port));
        server.stop();
        assert!(!answers(port));
        server.restart();
        assert_eq!(server.port(), port);
        assert!(answers(port));
        drop(server);
        assert!(!answers(port));
    }
}
