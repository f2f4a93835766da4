//! Python fork server: one Python interpreter that has imported the SDK
//! harness's modules and forks a fresh harness process for each PROCESS
//! worker, so a Python SDK harness starts in milliseconds instead of paying
//! the interpreter's start and Beam's imports (about 0.5 CPU s) every time.
//!
//! - The Weir server starts one per interpreter and start-up environment
//!   (`PYTHON*`, `LD_*`, `PATH`, protobuf's) on the first `weir boot --python` harness
//!   that needs it ([`ForkServers::socket_for`]), as its own child, and names
//!   its socket to every such `weir boot` in [`SOCKET_ENV`].
//! - `weir boot` asks it for the harness ([`run_forked`]) with the exact
//!   environment, folder and standard streams it would have exec'd Python
//!   with, then stands in for the harness: it ends as the harness ended (its
//!   exit code, or its signal), and its own end (killed by the server) kills
//!   the harness.
//! - Nothing of a job runs in the fork server, and its environment holds
//!   only the variables that shape the interpreter: each harness is forked
//!   before it reads the job's options or main session. What the forks
//!   share is what importing Beam set up; what Beam means to be per process
//!   (`random`, NumPy's global generator, the worker id its gRPC
//!   interceptor read, GroupIntoBatches' shard id prefix) is made afresh in
//!   each.
//! - When the fork server is not there (failed, disabled with
//!   `weir serve --python_fork_server=false`) or refuses (the files it
//!   imported changed on disk), `weir boot` execs Python. A fork server
//!   whose files changed exits after its last harness (exit code 75) and
//!   the next harness starts a new one.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Environment variable naming the fork server's socket to `weir boot`.
pub const SOCKET_ENV: &str = "WEIR_PYTHON_FORK_SERVER";

/// The fork server's Python source, written beside its socket.
const SOURCE: &str = include_str!("fork_server.py");

/// A fork server's exit code once the files it imported changed on disk (an
/// upgrade of Beam) and its last harness ended: a new one replaces it.
const STALE_EXIT: i32 = 75;

/// How long `weir boot` waits for a fork server that is still importing.
const READY_WAIT: Duration = Duration::from_secs(10);

/// How long `weir boot` waits for the forked harness's pid.
const PID_WAIT: Duration = Duration::from_secs(30);

/// Whether an environment variable is read as the interpreter starts or as
/// Beam and its dependencies are imported (protobuf, gRPC, NumPy's BLAS,
/// the locale, user site-packages, the temp folder), so that a fork server
/// serves only harnesses with the same values. A fork server is started
/// with these variables only.
fn shapes_interpreter(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "PYTHON",
        "LD_",
        "PROTOCOL_BUFFERS_",
        "TEMPORARILY_DISABLE_PROTOBUF",
        "GRPC_",
        "OMP_",
        "OPENBLAS_",
        "MKL_",
        "LC_",
    ];
    const NAMES: &[&str] = &["PATH", "HOME", "LANG", "TZ", "TMPDIR", "VIRTUAL_ENV"];
    PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name)
}

/// At most this many fork servers (interpreters or start-up environments)
/// per Weir server; more harnesses start their own interpreter.
const MAX_FORK_SERVERS: usize = 4;

/// Longest socket path a Unix socket address holds (sun_path, with room).
const MAX_SOCKET_PATH: usize = 100;

/// The fork servers of this Weir server, one per interpreter and start-up
/// environment; each lives as long as the server.
#[derive(Default)]
pub struct ForkServers {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    disabled: bool,
    dir: Option<PathBuf>,
    servers: HashMap<String, Running>,
}

/// A fork server: its socket and process (with its standard input, held
/// open: it ends when it reads end of input); no process once it could not
/// start or was seen to have failed (it is not started again; one that
/// exited as stale, [`STALE_EXIT`], is replaced instead).
struct Running {
    socket: PathBuf,
    process: Option<(std::process::Child, std::process::ChildStdin)>,
}

impl ForkServers {
    /// The process-wide set the server's PROCESS environments use.
    pub fn global() -> &'static ForkServers {
        static GLOBAL: std::sync::OnceLock<ForkServers> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(ForkServers::default)
    }

    /// With `false`, no fork server is started and `weir boot` execs Python.
    pub fn set_enabled(&self, enabled: bool) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .disabled = !enabled;
    }

    /// Ends every fork server (closing its input ends it and its harnesses)
    /// and removes their folder; none starts after this.
    pub fn stop(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.disabled = true;
        for (_, r) in inner.servers.drain() {
            if let Some((mut child, stdin)) = r.process {
                drop(stdin);
                let deadline = Instant::now() + Duration::from_secs(2);
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if let Some(dir) = inner.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// The socket of the fork server for `python` started with `env` (the
    /// whole environment `weir boot` will have), starting it on first use.
    /// `None` when disabled, or when it could not start or has exited (then
    /// once, a warning says why).
    pub fn socket_for(&self, python: &str, env: &HashMap<String, String>) -> Option<PathBuf> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.disabled {
            return None;
        }
        let resolved = on_path(python, env.get("PATH").map(String::as_str));
        let python = resolved.as_str();
        let mut shaping: Vec<(&String, &String)> =
            env.iter().filter(|(k, _)| shapes_interpreter(k)).collect();
        shaping.sort();
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (python, &shaping).hash(&mut h);
            format!("{:016x}", h.finish())
        };
        if let Some(r) = inner.servers.get_mut(&key) {
            let (child, _) = r.process.as_mut()?;
            match child.try_wait() {
                Ok(Some(status)) if status.code() == Some(STALE_EXIT) => {
                    tracing::info!(
                        "Beam's files changed under the Python fork server of {python}: starting a new one"
                    );
                    let _ = std::fs::remove_file(&r.socket);
                    inner.servers.remove(&key);
                }
                Ok(Some(status)) => {
                    r.process = None;
                    tracing::warn!(
                    "the Python fork server of {python} exited ({status}; its output: {}); its Python SDK harnesses start their own interpreter from now on",
                    r.socket.with_extension("log").display()
                );
                    return None;
                }
                _ => return Some(r.socket.clone()),
            }
        }
        if inner.servers.len() >= MAX_FORK_SERVERS {
            tracing::debug!(python, "{MAX_FORK_SERVERS} Python fork servers run already; this harness starts its own interpreter");
            return None;
        }
        let dir = match &inner.dir {
            Some(d) => d.clone(),
            None => match private_dir() {
                Ok(d) => inner.dir.insert(d).clone(),
                Err(e) => {
                    tracing::warn!("no Python fork server: {e}");
                    inner.disabled = true;
                    return None;
                }
            },
        };
        let socket = dir.join(format!("{key}.sock"));
        let log = dir.join(format!("{key}.log"));
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            tracing::warn!(
                "no Python fork server: its socket path {} is too long for a Unix socket (set TMPDIR to a shorter folder)",
                socket.display()
            );
            inner.disabled = true;
            return None;
        }
        let script = dir.join("fork_server.py");
        let started = std::fs::write(&script, SOURCE)
            .and_then(|()| std::fs::File::create(&log))
            .and_then(|log| {
                std::process::Command::new(python)
                    .arg(&script)
                    .arg(&socket)
                    .arg(crate::boot::PYTHON_HARNESS_MODULE)
                    .env_clear()
                    .envs(shaping.iter().copied())
                    .current_dir(&dir)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::null())
                    .stderr(log)
                    .spawn()
            });
        match started {
            Ok(mut child) => {
                let stdin = child.stdin.take().expect("piped stdin");
                let _ = std::fs::write(socket.with_extension("pid"), child.id().to_string());
                tracing::debug!(python, socket = %socket.display(), "started a Python fork server");
                inner.servers.insert(
                    key,
                    Running {
                        socket: socket.clone(),
                        process: Some((child, stdin)),
                    },
                );
                Some(socket)
            }
            Err(e) => {
                tracing::warn!("cannot start a Python fork server with {python}: {e}");
                inner.servers.insert(
                    key,
                    Running {
                        socket,
                        process: None,
                    },
                );
                None
            }
        }
    }
}

/// A folder only this user can enter, for the fork servers' sockets and logs.
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("weir-fork-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// `python` found on `path` (a `PATH` value) when it is a bare name, so
/// `python3` and the file it runs share one fork server; as given when it
/// has a `/` or is not found. Symbolic links are not followed: a virtual
/// environment's `bin/python` links to its base interpreter but is another
/// environment.
fn on_path(python: &str, path: Option<&str>) -> String {
    use std::os::unix::fs::PermissionsExt;
    if python.contains('/') {
        return python.to_string();
    }
    std::env::split_paths(path.unwrap_or_default())
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(python))
        .find(|file| {
            std::fs::metadata(file).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .map_or_else(|| python.to_string(), |file| file.display().to_string())
}

/// This process's environment, as the `env` of [`ForkServers::socket_for`]
/// (variables not in UTF-8 left out).
pub fn own_env() -> HashMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// The interpreter a PROCESS command runs when it is this binary's
/// `weir boot` for Python (`program` by path, or by name on `path`, the
/// harness's `PATH`): `--python X` or `--python=X`, else `weir_python`
/// (the `WEIR_PYTHON` it will see) when not empty, else `python3`. `None`
/// for another command or `--java`.
pub fn boot_python(
    program: &str,
    args: &[String],
    weir_python: Option<&str>,
    path: Option<&str>,
) -> Option<String> {
    let me = crate::weir_exe()?.canonicalize().ok()?;
    if std::fs::canonicalize(on_path(program, path)).ok()? != me
        || args.first().map(String::as_str) != Some("boot")
    {
        return None;
    }
    if args.iter().any(|a| a == "--java" || a == "--go") {
        return None;
    }
    let mut python = None;
    for (i, a) in args.iter().enumerate() {
        if a == "--python" {
            python = args.get(i + 1).cloned();
        } else if let Some(v) = a.strip_prefix("--python=") {
            python = Some(v.to_string());
        }
    }
    Some(
        python
            .or_else(|| weir_python.filter(|v| !v.is_empty()).map(str::to_string))
            .unwrap_or_else(|| "python3".into()),
    )
}

/// Runs `cmd` (`python -m apache_beam.runners.worker.sdk_worker_main` with
/// its environment) as a fork of the fork server at `socket`, with this
/// process's environment and standard streams, in `cmd`'s folder (else
/// this process's), writes the harness's
/// pid to `pid_file` and exits with its code. Returns (with the reason) when
/// the fork server cannot take it, for the caller to exec `cmd` instead.
pub fn run_forked(socket: &Path, cmd: &std::process::Command, pid_file: &Path) -> String {
    let mut env = HashMap::new();
    for (k, v) in std::env::vars_os() {
        match (k.into_string(), v.into_string()) {
            (Ok(k), Ok(v)) if k != SOCKET_ENV => {
                env.insert(k, v);
            }
            (Ok(_), Ok(_)) => {}
            (k, _) => return format!("a variable of the environment is not UTF-8 ({k:?})"),
        }
    }
    for (k, v) in cmd.get_envs() {
        let k = k.to_string_lossy().into_owned();
        match v {
            Some(v) => {
                env.insert(k, v.to_string_lossy().into_owned());
            }
            None => {
                env.remove(&k);
            }
        }
    }
    // After `-m <module>`: what the module sees in sys.argv[1:].
    let argv: Vec<String> = cmd
        .get_args()
        .skip(2)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cwd = match cmd.get_current_dir() {
        Some(d) => d.to_path_buf(),
        None => match std::env::current_dir() {
            Ok(d) => d,
            Err(e) => return format!("no current folder: {e}"),
        },
    };
    let stream = match connect(socket) {
        Ok(s) => s,
        Err(e) => return e,
    };
    // The harness runs where this process may (a core of its own when the
    // server pinned it, see `crate::cores`), as it would after an exec.
    let cpus = crate::cores::allowed_cpus();
    let request = serde_json::json!({"argv": argv, "env": env, "cwd": cwd, "cpus": cpus});
    let mut line = request.to_string().into_bytes();
    line.push(b'\n');
    if let Err(e) = send_with_fds(&stream, &line, &[0, 1, 2]) {
        return format!("cannot send the request: {e}");
    }
    // The fork itself takes milliseconds; a fork server that does not answer
    // is dropped (it kills a late harness when this connection closes).
    let _ = stream.set_read_timeout(Some(PID_WAIT));
    let mut replies = BufReader::new(&stream);
    let mut reply = String::new();
    match replies.read_line(&mut reply) {
        Ok(n) if n > 0 => {}
        Ok(_) => return "the fork server closed the connection".into(),
        Err(e) => return format!("no answer: {e}"),
    }
    let Some(pid) = reply.trim().strip_prefix("pid ") else {
        return format!("the fork server refused: {}", reply.trim());
    };
    let _ = std::fs::write(pid_file, pid);
    // From here on this process stands in for the harness.
    let _ = stream.set_read_timeout(None);
    reply.clear();
    let code = match replies.read_line(&mut reply) {
        Ok(n) if n > 0 => reply
            .trim()
            .strip_prefix("exit ")
            .and_then(|c| c.parse::<i32>().ok())
            .unwrap_or(1),
        _ => 1,
    };
    let _ = std::io::stdout().flush();
    if code < 0 {
        // Killed by a signal: so is this process, as the server expects.
        // SAFETY: resetting a disposition and raising a signal in a
        // single-threaded process.
        unsafe {
            libc::signal(-code, libc::SIG_DFL);
            libc::raise(-code);
        }
        std::process::exit(128 - code)
    }
    std::process::exit(code)
}

/// Connects to the fork server, waiting while it is still starting (its
/// socket not there yet, its process alive: pid in `<socket>.pid`).
fn connect(socket: &Path) -> Result<UnixStream, String> {
    let deadline = Instant::now() + READY_WAIT;
    loop {
        match UnixStream::connect(socket) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline && starting(socket) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("cannot reach {}: {e}", socket.display())),
        }
    }
}

/// Whether a fork server serves at `socket` or is starting to.
pub fn available(socket: &Path) -> bool {
    socket.exists() || starting(socket)
}

/// Whether the fork server of `socket` is alive (not exited, not a zombie)
/// but has not bound its socket yet.
fn starting(socket: &Path) -> bool {
    if socket.exists() {
        return false;
    }
    let Ok(pid) = std::fs::read_to_string(socket.with_extension("pid")) else {
        return false;
    };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) else {
        return false;
    };
    // The state follows the parenthesised command name.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Sends `data` with the descriptors `fds` attached (SCM_RIGHTS).
fn send_with_fds(stream: &UnixStream, data: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: the control buffer is sized by CMSG_SPACE and 8-byte aligned;
    // every pointer handed to sendmsg outlives the call.
    let sent = unsafe {
        let space = libc::CMSG_SPACE(fd_bytes as u32) as usize;
        let mut control = vec![0u64; space.div_ceil(8)];
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr(),
            libc::CMSG_DATA(cmsg).cast::<RawFd>(),
            fds.len(),
        );
        libc::sendmsg(stream.as_raw_fd(), &msg, 0)
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    (&*stream).write_all(&data[sent as usize..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_this_binarys_python_boot_is_forked() {
        let me = std::env::current_exe().unwrap().display().to_string();
        let none = None;
        let env = Some("/venv/bin/python");
        let boot = |a: &[&str], env: Option<&str>| boot_python(&me, &args(a), env, None);
        assert_eq!(
            boot(&["boot", "--python", "/py", "--id=w"], none).as_deref(),
            Some("/py")
        );
        assert_eq!(
            boot(&["boot", "--id=w", "--python=/py3"], none).as_deref(),
            Some("/py3")
        );
        assert_eq!(
            boot(&["boot", "--id=w"], env).as_deref(),
            Some("/venv/bin/python")
        );
        assert_eq!(boot(&["boot", "--id=w"], none).as_deref(), Some("python3"));
        assert_eq!(boot(&["boot", "--id=w"], Some("")).as_deref(), Some("python3"));
        assert_eq!(boot(&["boot", "--java", "--id=w"], none), None);
        assert_eq!(boot(&["boot", "--go", "--id=w"], none), None);
        assert_eq!(boot(&["serve"], none), None);
        assert_eq!(
            boot_python("/bin/sh", &args(&["boot", "--python", "/py"]), none, None),
            None
        );
        // By name, found on the harness's PATH.
        let exe = std::env::current_exe().unwrap();
        let (dir, name) = (exe.parent().unwrap(), exe.file_name().unwrap().to_str().unwrap());
        let path = format!("/nonexistent:{}", dir.display());
        let by_name = |path| boot_python(name, &args(&["boot", "--python", "/py"]), none, path);
        assert_eq!(by_name(Some(&path)).as_deref(), Some("/py"));
        assert_eq!(by_name(Some("/nonexistent")), None);
    }

    #[test]
    fn interpreter_variables_pick_the_fork_server() {
        for name in [
            "PYTHONPATH",
            "PYTHONHASHSEED",
            "LD_PRELOAD",
            "PATH",
            "HOME",
            "LANG",
            "LC_ALL",
            "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION",
            "OPENBLAS_NUM_THREADS",
            "GRPC_VERBOSITY",
        ] {
            assert!(shapes_interpreter(name), "{name}");
        }
        for name in [
            "WORKER_ID",
            "PIPELINE_OPTIONS_FILE",
            "AWS_SECRET_ACCESS_KEY",
            SOCKET_ENV,
        ] {
            assert!(!shapes_interpreter(name), "{name}");
        }
    }

    /// A stand-in for Python that counts its starts and exits with `code`.
    fn fake_python(dir: &Path, code: i32) -> String {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join(format!("python-{code}"));
        let count = dir.join(format!("starts-{code}"));
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho x >> {}\nexit {code}\n", count.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script.display().to_string()
    }

    fn starts(dir: &Path, code: i32) -> usize {
        std::fs::read_to_string(dir.join(format!("starts-{code}"))).map_or(0, |s| s.lines().count())
    }

    fn wait_for_exit(servers: &ForkServers) {
        for _ in 0..500 {
            let mut inner = servers.inner.lock().unwrap();
            let running = inner.servers.values_mut().any(|r| {
                r.process
                    .as_mut()
                    .is_some_and(|(c, _)| matches!(c.try_wait(), Ok(None)))
            });
            if !running {
                return;
            }
            drop(inner);
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the fake fork server did not exit");
    }

    #[test]
    fn a_stale_fork_server_is_replaced_and_a_failed_one_is_not() {
        let dir = std::env::temp_dir().join(format!("weir-fork-fake-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let env = HashMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        let servers = ForkServers::default();
        // Exit 75: Beam changed on disk; the next harness gets a new one.
        let stale = fake_python(&dir, STALE_EXIT);
        assert!(servers.socket_for(&stale, &env).is_some());
        wait_for_exit(&servers);
        assert!(servers.socket_for(&stale, &env).is_some());
        wait_for_exit(&servers);
        assert_eq!(starts(&dir, STALE_EXIT), 2);
        // Any other exit: failed, never started again.
        let failed = fake_python(&dir, 1);
        assert!(servers.socket_for(&failed, &env).is_some());
        wait_for_exit(&servers);
        assert_eq!(servers.socket_for(&failed, &env), None);
        assert_eq!(servers.socket_for(&failed, &env), None);
        assert_eq!(starts(&dir, 1), 1);
        servers.stop();
        assert_eq!(servers.socket_for(&stale, &env), None, "none after stop");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An interpreter named bare and by the file PATH finds for it share
    /// one fork server; a name PATH does not find is kept as it is.
    #[test]
    fn a_bare_interpreter_name_shares_the_fork_server_of_its_file() {
        let dir = std::env::temp_dir().join(format!("weir-fork-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        // A stand-in that runs until its input ends, as a fork server does.
        let file = dir.join("python-waits").display().to_string();
        std::fs::write(&file, format!("#!/bin/sh\necho x >> {}/starts-0\ncat >/dev/null\n", dir.display()))
            .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bare = "python-waits".to_string();
        let path = format!("relative:{}", dir.display());
        assert_eq!(on_path(&bare, Some(&path)), file);
        assert_eq!(on_path(&bare, Some("/nonexistent")), bare);
        assert_eq!(on_path("bin/python", Some(&path)), "bin/python");
        let env = HashMap::from([("PATH".to_string(), format!("{path}:/usr/bin:/bin"))]);
        let servers = ForkServers::default();
        let by_name = servers.socket_for(&bare, &env);
        assert!(by_name.is_some());
        assert_eq!(servers.socket_for(&file, &env), by_name);
        // The stand-in has run (its start is written) before it is stopped.
        for _ in 0..1000 {
            if starts(&dir, 0) > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        servers.stop();
        assert_eq!(starts(&dir, 0), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_fork_server_that_never_started_is_not_waited_for() {
        let dir = std::env::temp_dir().join(format!("weir-fork-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("x.sock");
        // No pid file: nothing is starting.
        assert!(!starting(&socket));
        // This process is alive: it is starting until the socket exists.
        std::fs::write(socket.with_extension("pid"), std::process::id().to_string()).unwrap();
        assert!(starting(&socket));
        std::fs::write(socket.with_extension("pid"), "999999999").unwrap();
        assert!(!starting(&socket));
        let started = Instant::now();
        assert!(connect(&socket).is_err());
        assert!(started.elapsed() < Duration::from_secs(1));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
