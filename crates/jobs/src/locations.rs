//! A job's temp and staging locations (Dataflow's `temp_location`,
//! `gcp_temp_location`, `staging_location`; Java `tempLocation`,
//! `gcpTempLocation`, `stagingLocation`) as `object_store` stores.
//!
//! A location is a local path, a `file://` URL, or a `gs://` / `s3://` URL.
//! Local paths and `file://` go to [`LocalFileSystem`]; `gs://` to Google
//! Cloud Storage and `s3://` to Amazon S3, both configured from the
//! environment as `object_store` reads it (`GOOGLE_*`, `AWS_*`). Unset
//! locations default the way the SDKs document it:
//!
//! * staging: `staging_location`; else (Java) `gcp_temp_location` + `/staging`;
//!   else (Python) `temp_location`; else Weir's staging folder (`weir serve
//!   --staging_dir`, `<tmp>/weir-staging` by default).
//! * temp: `temp_location`; else `gcp_temp_location`; else (Go)
//!   `staging_location` + `/tmp`; else `<tmp>/weir-temp`. A local temp
//!   location outside Weir's folders is the SDK's alone: the server makes
//!   no folder there and keeps its own in `<tmp>/weir-temp` (unless
//!   `weir serve --allow_client_staging_locations`).
//!
//! Each job works in its own folder `<location>/<job id>/`.
//!
//! Errors name the option and the location: `pipeline option
//! --temp_location: gs://b/x: no Google Cloud credentials found ...`.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

use crate::options::{JobOptions, OptionError};

/// How long Prepare waits for a cloud location to answer its probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// What kind of store a location uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// A local folder (a path or `file://`).
    Local,
    /// Google Cloud Storage (`gs://bucket/...`).
    Gcs,
    /// Amazon S3 (`s3://bucket/...`).
    S3,
}

/// One resolved location: a store and a prefix inside it.
#[derive(Clone, Debug)]
pub struct Location {
    /// The option it came from, as the user spelled it; `None` for Weir's default.
    pub option: Option<String>,
    /// The location as given (for errors and messages), or the default folder.
    pub url: String,
    pub kind: StoreKind,
    pub store: Arc<dyn ObjectStore>,
    /// Prefix of the location inside `store` (empty for local folders,
    /// whose store is rooted at the folder).
    pub prefix: Path,
    /// The folder, for local locations.
    pub local: Option<PathBuf>,
}

/// Where a job stages its artifacts and keeps its temp files.
#[derive(Clone, Debug)]
pub struct JobLocations {
    pub staging: Location,
    pub temp: Location,
}

/// What the environment offers for cloud credentials; [`SystemEnv`] reads
/// the real one, tests give their own.
pub trait Environment {
    /// An environment variable (None when unset or empty).
    fn var(&self, name: &str) -> Option<String>;
    /// Whether a file exists.
    fn exists(&self, path: &FsPath) -> bool;
    /// A small text file (DMI strings under `/sys`), if readable.
    fn read(&self, path: &FsPath) -> Option<String>;
}

/// The process environment and file system.
pub struct SystemEnv;

impl Environment for SystemEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.trim().is_empty())
    }
    fn exists(&self, path: &FsPath) -> bool {
        path.exists()
    }
    fn read(&self, path: &FsPath) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }
}

fn err(option: &str, reason: impl Into<String>) -> OptionError {
    OptionError {
        option: option.to_string(),
        reason: reason.into(),
    }
}

fn truthy(v: Option<String>) -> bool {
    v.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
}

/// Why no Google Cloud credentials can be found without the network, or
/// `None` when some are configured: a service account (`GOOGLE_SERVICE_ACCOUNT`,
/// `GOOGLE_SERVICE_ACCOUNT_PATH`, `GOOGLE_SERVICE_ACCOUNT_KEY`,
/// `GOOGLE_APPLICATION_CREDENTIALS`), application default credentials
/// (`~/.config/gcloud/application_default_credentials.json`), a Compute
/// Engine VM (its metadata server), or `GOOGLE_SKIP_SIGNATURE=true`.
pub fn missing_gcs_credentials(env: &dyn Environment) -> Option<String> {
    let vars = [
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_PATH",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "SERVICE_ACCOUNT",
    ];
    if vars.iter().any(|v| env.var(v).is_some()) || truthy(env.var("GOOGLE_SKIP_SIGNATURE")) {
        return None;
    }
    if let Some(home) = env.var("HOME") {
        let adc = FsPath::new(&home).join(".config/gcloud/application_default_credentials.json");
        if env.exists(&adc) {
            return None;
        }
    }
    // Google's auth libraries detect Compute Engine the same way.
    if env
        .read(FsPath::new("/sys/class/dmi/id/product_name"))
        .is_some_and(|p| p.contains("Google"))
    {
        return None;
    }
    Some("no Google Cloud credentials found: set GOOGLE_APPLICATION_CREDENTIALS (or GOOGLE_SERVICE_ACCOUNT) to a service account key file, run `gcloud auth application-default login`, or run Weir on Compute Engine".into())
}

/// As [`missing_gcs_credentials`], for S3: `AWS_ACCESS_KEY_ID` with
/// `AWS_SECRET_ACCESS_KEY`, a web identity token (`AWS_WEB_IDENTITY_TOKEN_FILE`),
/// container credentials (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` / `_FULL_URI`),
/// an EC2 instance, or `AWS_SKIP_SIGNATURE=true`. (`object_store` does not
/// read `~/.aws/credentials` or `AWS_PROFILE`.)
pub fn missing_s3_credentials(env: &dyn Environment) -> Option<String> {
    if (env.var("AWS_ACCESS_KEY_ID").is_some() && env.var("AWS_SECRET_ACCESS_KEY").is_some())
        || env.var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some()
        || env.var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        || env.var("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
        || truthy(env.var("AWS_SKIP_SIGNATURE"))
    {
        return None;
    }
    let ec2 = [
        "/sys/class/dmi/id/board_vendor",
        "/sys/class/dmi/id/sys_vendor",
    ]
    .iter()
    .any(|p| {
        env.read(FsPath::new(p))
            .is_some_and(|v| v.contains("Amazon"))
    }) || env
        .read(FsPath::new("/sys/hypervisor/uuid"))
        .is_some_and(|u| u.to_ascii_lowercase().starts_with("ec2"));
    if ec2 {
        return None;
    }
    let profile = if env.var("AWS_PROFILE").is_some() {
        " (AWS_PROFILE and ~/.aws/credentials are not read)"
    } else {
        ""
    };
    Some(format!("no AWS credentials found{profile}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_DEFAULT_REGION), AWS_WEB_IDENTITY_TOKEN_FILE, or run Weir on EC2"))
}

/// Short timeouts and few retries: a wrong bucket should fail Prepare in
/// seconds, not after object_store's default three minutes of retries.
fn cloud_client() -> (ClientOptions, RetryConfig) {
    let client = ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(60));
    let retry = RetryConfig {
        max_retries: 2,
        retry_timeout: Duration::from_secs(15),
        ..RetryConfig::default()
    };
    (client, retry)
}

/// Opens `location` (the value of option `option`, as spelled): a local
/// path or `file://` URL (created if missing; relative paths are relative
/// to the server's working directory), or a `gs://` / `s3://` URL.
///
/// # Errors
/// The option and location with the reason: an unsupported scheme, no
/// bucket, no credentials in the environment (checked without the network,
/// see [`missing_gcs_credentials`]), a folder that cannot be created.
pub fn open(option: &str, location: &str, env: &dyn Environment) -> Result<Location, OptionError> {
    let fail = |reason: String| err(option, format!("{location}: {reason}"));
    let lower = location.to_ascii_lowercase();
    let (kind, rest) = if let Some(rest) = lower.strip_prefix("gs://") {
        (StoreKind::Gcs, &location[location.len() - rest.len()..])
    } else if let Some(rest) = lower.strip_prefix("s3://") {
        (StoreKind::S3, &location[location.len() - rest.len()..])
    } else if lower.starts_with("file://") {
        let url = url::Url::parse(location).map_err(|e| fail(format!("not a file URL: {e}")))?;
        let path = url.to_file_path().map_err(|()| {
            fail("a file:// URL must name an absolute local path (file:///dir)".into())
        })?;
        return local(option, location, &path);
    } else if let Some((scheme, _)) = location.split_once("://").filter(|(s, _)| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    }) {
        return Err(fail(format!(
            "scheme {scheme}:// is not supported; use a local path, file://, gs:// or s3://"
        )));
    } else {
        return local(option, location, FsPath::new(location));
    };
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(fail("names no bucket".into()));
    }
    let missing = match kind {
        StoreKind::Gcs => missing_gcs_credentials(env),
        _ => missing_s3_credentials(env),
    };
    if let Some(why) = missing {
        return Err(fail(why));
    }
    let (client, retry) = cloud_client();
    let store: Arc<dyn ObjectStore> = match kind {
        StoreKind::Gcs => Arc::new(
            GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_client_options(client)
                .with_retry(retry)
                .build()
                .map_err(|e| fail(format!("cannot open the bucket: {e}")))?,
        ),
        _ => Arc::new(
            AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_client_options(client)
                .with_retry(retry)
                .build()
                .map_err(|e| fail(format!("cannot open the bucket: {e}")))?,
        ),
    };
    Ok(Location {
        option: Some(option.to_string()),
        url: location.to_string(),
        kind,
        store,
        prefix: Path::parse(key.trim_matches('/'))
            .map_err(|e| fail(format!("not a valid object path: {e}")))?,
        local: None,
    })
}

fn local(option: &str, location: &str, path: &FsPath) -> Result<Location, OptionError> {
    let fail = |reason: String| err(option, format!("{location}: {reason}"));
    let dir = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| fail(format!("cannot resolve a relative path: {e}")))?
            .join(path)
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail(format!("cannot create the folder: {e}")))?;
    let store = LocalFileSystem::new_with_prefix(&dir)
        .map_err(|e| fail(format!("cannot use the folder: {e}")))?;
    Ok(Location {
        option: Some(option.to_string()),
        url: location.to_string(),
        kind: StoreKind::Local,
        store: Arc::new(store),
        prefix: Path::default(),
        local: Some(dir),
    })
}

fn staging_refused(option: &str, location: &str, root: &FsPath) -> OptionError {
    err(
        option,
        format!(
            "{location}: outside this server's staging root {} (weir serve {} lets clients choose)",
            root.display(),
            crate::limits::flag::ALLOW_CLIENT_STAGING_LOCATIONS
        ),
    )
}

/// Weir's own folder `dir` as a location (no option).
///
/// # Errors
/// When the folder cannot be created.
pub fn default_folder(dir: &FsPath) -> Result<Location, String> {
    let mut l = local("", &dir.display().to_string(), dir).map_err(|e| e.reason)?;
    l.option = None;
    Ok(l)
}

impl Location {
    /// `prefix/parts...` inside the store.
    pub fn path(&self, parts: &[&str]) -> Path {
        let mut p = self.prefix.clone();
        for part in parts {
            p = p.join(*part);
        }
        p
    }

    /// How `path` (inside this store) is shown and named in artifact
    /// payloads: a local file path, or the `gs://` / `s3://` URL.
    pub fn display(&self, path: &Path) -> String {
        match (&self.local, self.kind) {
            (Some(dir), _) => dir.join(path.as_ref()).display().to_string(),
            (None, StoreKind::Gcs) => format!("gs://{}/{path}", self.bucket()),
            (None, _) => format!("s3://{}/{path}", self.bucket()),
        }
    }

    fn bucket(&self) -> &str {
        let rest = &self.url[5..]; // after gs:// or s3://
        rest.split('/').next().unwrap_or(rest)
    }

    /// "--option=url" or "Weir's folder url", for messages.
    pub fn describe(&self) -> String {
        match &self.option {
            Some(o) => format!("--{o}={}", self.url),
            None => format!("Weir's folder {}", self.url),
        }
    }

    /// An error about this location, naming its option.
    pub fn error(&self, reason: impl std::fmt::Display) -> String {
        match &self.option {
            Some(o) => format!("pipeline option --{o}: {}: {reason}", self.url),
            None => format!("{}: {reason}", self.url),
        }
    }

    /// Writes and deletes a small object under `prefix/job_id/` to check
    /// that the location is reachable and writable.
    ///
    /// # Errors
    /// [`Location::error`] text with the store's error or the timeout.
    pub async fn probe(&self, job_id: &str) -> Result<(), String> {
        let path = self.path(&[job_id, ".weir-probe"]);
        let work = async {
            self.store
                .put(&path, PutPayload::from_static(b"weir"))
                .await?;
            self.store.delete(&path).await
        };
        match tokio::time::timeout(PROBE_TIMEOUT, work).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.error(format!("cannot write there: {e}"))),
            Err(_) => Err(self.error(format!("no answer within {}s", PROBE_TIMEOUT.as_secs()))),
        }
    }

    /// Deletes every object under `prefix/job_id/` (best effort).
    pub async fn remove_job_folder(&self, job_id: &str) {
        if let Some(dir) = &self.local {
            let _ = tokio::fs::remove_dir_all(dir.join(job_id)).await;
            return;
        }
        use futures::StreamExt;
        let prefix = self.path(&[job_id]);
        let mut listing = self.store.list(Some(&prefix));
        while let Some(Ok(meta)) = listing.next().await {
            let _ = self.store.delete(&meta.location).await;
        }
    }
}

/// Weir's default folders when no option names one.
#[derive(Clone, Debug)]
pub struct Defaults {
    /// The server's staging root (`weir serve --staging_dir`).
    pub staging: PathBuf,
    /// The root of Weir's temp folders (`<tmp>/weir-temp`).
    pub temp: PathBuf,
    /// Where a job's default staging folder goes: this server's own folder
    /// under `staging` (see [`ServerFolder`]).
    pub own_staging: PathBuf,
    /// Where a job's default temp folder goes: this server's own folder under `temp`.
    pub own_temp: PathBuf,
    /// A client's `staging_location` may name any folder or bucket
    /// (`weir serve --allow_client_staging_locations`); otherwise only a
    /// folder under [`Defaults::staging`].
    pub client_staging_anywhere: bool,
}

/// Names of the folders (and, with `.lock`, of their lock files) that
/// servers claim under a root of Weir's.
const SERVER_FOLDER_PREFIX: &str = ".weir-server-";

/// How old an unfinished claim (a `.lock.new` file no one holds) must be
/// before another server removes it.
const ABANDONED_CLAIM_AGE: Duration = Duration::from_secs(60);

/// One server's own folder under a root of Weir's
/// (`<root>/.weir-server-<uuid>/`), where its jobs' default staging or temp
/// folders go. The server holds an exclusive lock on
/// `<root>/.weir-server-<uuid>.lock` while it lives (the operating system
/// lets go of it when the process ends, crash or not); a server that claims
/// a folder first removes those of servers no longer alive on this machine
/// (the lock file holds the kernel's boot id: a lock held on another
/// machine through a shared folder may not show here), with whatever their
/// jobs left there.
#[derive(Debug)]
pub struct ServerFolder {
    /// The folder: `<root>/.weir-server-<uuid>`.
    pub dir: PathBuf,
    _lock: std::fs::File,
}

impl ServerFolder {
    /// Claims a new folder under `root` (created if missing), after removing
    /// the folders of servers that hold their lock no more. Returns the
    /// folder and what was removed.
    ///
    /// # Errors
    /// The I/O error creating `root`, the lock file or the folder, or taking the lock.
    pub fn claim(root: &FsPath) -> std::io::Result<(ServerFolder, Vec<PathBuf>)> {
        std::fs::create_dir_all(root)?;
        let removed = remove_abandoned(root);
        let name = format!("{SERVER_FOLDER_PREFIX}{}", uuid::Uuid::new_v4().simple());
        // Locked before it is named as a claim: no other server can take
        // it for an abandoned one in between.
        let pending = root.join(format!("{name}.lock.new"));
        let mut lock = std::fs::File::create(&pending)?;
        lock.lock()?;
        std::io::Write::write_all(&mut lock, this_boot().as_bytes())?;
        std::fs::rename(&pending, root.join(format!("{name}.lock")))?;
        let dir = root.join(&name);
        std::fs::create_dir_all(&dir)?;
        Ok((ServerFolder { dir, _lock: lock }, removed))
    }
}

impl Drop for ServerFolder {
    /// A server that stops cleanly takes its folder along if its jobs left
    /// nothing in it (a crashed one's goes at the next claim).
    fn drop(&mut self) {
        if std::fs::remove_dir(&self.dir).is_ok() {
            let mut lock = self.dir.clone().into_os_string();
            lock.push(".lock");
            let _ = std::fs::remove_file(lock);
        }
    }
}

/// This machine's boot id (`/proc/sys/kernel/random/boot_id`, random at
/// each boot of its kernel), as its lock files record it; empty where it
/// cannot be read.
fn this_boot() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Removes the server folders under `root` whose lock no process holds,
/// with their lock files; returns the folders removed.
fn remove_abandoned(root: &FsPath) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let boot = &this_boot();
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else { continue };
        if !name.starts_with(SERVER_FOLDER_PREFIX) {
            continue;
        }
        let lock_path = entry.path();
        let claim = if let Some(folder) = name.strip_suffix(".lock") {
            Some(folder)
        } else if name.ends_with(".lock.new") {
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > ABANDONED_CLAIM_AGE);
            if !old {
                continue;
            }
            None
        } else {
            continue;
        };
        // Only those of this machine's running kernel: a lock taken on
        // another machine through a shared folder may not show here.
        if boot.is_empty() || std::fs::read_to_string(&lock_path).ok().as_deref() != Some(boot.as_str()) {
            continue;
        }
        let Ok(file) = std::fs::OpenOptions::new().write(true).open(&lock_path) else {
            continue;
        };
        // Held: its server is alive.
        if file.try_lock().is_err() {
            continue;
        }
        if let Some(folder) = claim {
            let dir = root.join(folder);
            if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
                removed.push(dir);
            }
        }
        let _ = std::fs::remove_file(&lock_path);
    }
    removed
}

/// `path` made absolute (against the current folder) and free of `.` and
/// `..`, following symbolic links of the part that exists.
fn normalized(path: &FsPath) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    // The longest existing ancestor, with its links resolved.
    let mut rest = Vec::new();
    let mut base = out.clone();
    while !base.exists() {
        match (base.file_name().map(|n| n.to_os_string()), base.parent()) {
            (Some(n), Some(p)) => {
                rest.push(n);
                base = p.to_path_buf();
            }
            _ => break,
        }
    }
    let mut real = base.canonicalize().unwrap_or(base);
    for n in rest.into_iter().rev() {
        real.push(n);
    }
    real
}

/// The local folder a location names, if it is a path or a `file://` URL.
fn local_path(location: &str) -> Option<PathBuf> {
    let lower = location.to_ascii_lowercase();
    if lower.starts_with("file://") {
        return url::Url::parse(location).ok()?.to_file_path().ok();
    }
    if location.contains("://") {
        return None;
    }
    Some(PathBuf::from(location))
}

/// True when `location` is a folder under the staging root `root`.
fn under_root(location: &str, root: &FsPath) -> bool {
    local_path(location).is_some_and(|p| normalized(&p).starts_with(normalized(root)))
}

/// Resolves a job's staging and temp locations from its validated options
/// (see the module doc for the defaulting rules of each SDK).
///
/// # Errors
/// The first location that cannot be opened, naming its option.
pub fn resolve(
    options: &JobOptions,
    defaults: &Defaults,
    env: &dyn Environment,
) -> Result<JobLocations, OptionError> {
    let spelled = |name: &'static str| {
        options
            .spellings
            .get(name)
            .cloned()
            .unwrap_or_else(|| name.to_string())
    };
    let join = |base: &str, child: &str| format!("{}/{child}", base.trim_end_matches('/'));
    let staging = if let Some(s) = &options.staging_location {
        Some((spelled("staging_location"), s.clone()))
    } else if let Some(g) = &options.gcp_temp_location {
        Some((spelled("gcp_temp_location"), join(g, "staging")))
    } else {
        options
            .temp_location
            .as_ref()
            .map(|t| (spelled("temp_location"), t.clone()))
    };
    let temp = if let Some(t) = &options.temp_location {
        Some((spelled("temp_location"), t.clone()))
    } else if let Some(g) = &options.gcp_temp_location {
        Some((spelled("gcp_temp_location"), g.clone()))
    } else {
        options
            .staging_location
            .as_ref()
            .map(|s| (spelled("staging_location"), join(s, "tmp")))
    };
    // Only the operator decides where staging writes: a client's location
    // outside the staging root is refused (an explicit staging_location) or
    // ignored (one derived from a temp location), unless allowed.
    let outside = |(_, location): &(String, String)| {
        !defaults.client_staging_anywhere && !under_root(location, &defaults.staging)
    };
    let staging = match staging {
        Some(s) if outside(&s) && options.staging_location.is_some() => {
            if local_path(&s.1).is_some() {
                return Err(staging_refused(&s.0, &s.1, &defaults.staging));
            }
            // A cloud location: its own errors (credentials) first.
            open(&s.0, &s.1, env)?;
            return Err(staging_refused(&s.0, &s.1, &defaults.staging));
        }
        Some(s) if outside(&s) => None,
        s => s,
    };
    // Nor where the server makes folders: a client's local temp location
    // outside Weir's folders is left to the SDK (which writes its temp
    // files there itself), and the server's own temp folder for the job is
    // Weir's, unless allowed.
    let temp = match temp {
        Some(t)
            if !defaults.client_staging_anywhere
                && local_path(&t.1).is_some()
                && !under_root(&t.1, &defaults.staging)
                && !under_root(&t.1, &defaults.temp) =>
        {
            None
        }
        t => t,
    };
    let open_or = |given: Option<(String, String)>, default: &FsPath, what: &str| match given {
        Some((option, location)) => open(&option, &location, env),
        None => default_folder(default).map_err(|reason| OptionError {
            option: what.to_string(),
            reason: format!("Weir's default folder: {reason}"),
        }),
    };
    Ok(JobLocations {
        staging: open_or(staging, &defaults.own_staging, "staging_location")?,
        temp: open_or(temp, &defaults.own_temp, "temp_location")?,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use object_store::memory::InMemory;

    use super::*;

    /// An environment with the given variables and files, nothing else.
    #[derive(Default)]
    struct FakeEnv {
        vars: HashMap<&'static str, &'static str>,
        files: HashMap<&'static str, &'static str>,
    }

    impl Environment for FakeEnv {
        fn var(&self, name: &str) -> Option<String> {
            self.vars.get(name).map(|v| v.to_string())
        }
        fn exists(&self, path: &FsPath) -> bool {
            self.files.contains_key(path.to_str().unwrap_or(""))
        }
        fn read(&self, path: &FsPath) -> Option<String> {
            self.files
                .get(path.to_str().unwrap_or(""))
                .map(|v| v.to_string())
        }
    }

    fn env(vars: &[(&'static str, &'static str)]) -> FakeEnv {
        FakeEnv {
            vars: vars.iter().copied().collect(),
            ..FakeEnv::default()
        }
    }

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("weir-locations-{}-{name}", std::process::id()))
    }

    /// A claim removes what servers no longer alive left (their lock is not
    /// held) and keeps live servers' folders.
    #[test]
    fn a_server_folder_claim_removes_only_dead_servers_folders() {
        let root = scratch("server-folders");
        let _ = std::fs::remove_dir_all(&root);
        let (alive, removed) = ServerFolder::claim(&root).unwrap();
        assert!(removed.is_empty());
        std::fs::write(alive.dir.join("staged"), b"x").unwrap();
        // A crashed server: its folder and lock file, the lock held by no one.
        let dead = root.join(".weir-server-dead");
        std::fs::create_dir_all(dead.join("job-1")).unwrap();
        std::fs::write(dead.join("job-1").join("1-artifact"), b"left behind").unwrap();
        std::fs::write(root.join(".weir-server-dead.lock"), this_boot()).unwrap();
        // Another machine's, through a shared folder: its lock may not show here.
        std::fs::create_dir_all(root.join(".weir-server-elsewhere")).unwrap();
        std::fs::write(root.join(".weir-server-elsewhere.lock"), b"another-host").unwrap();
        // Neither a client's folder under the root nor a fresh claim in progress is touched.
        std::fs::create_dir_all(root.join("client-a")).unwrap();
        std::fs::write(root.join(".weir-server-starting.lock.new"), b"").unwrap();
        let (second, removed) = ServerFolder::claim(&root).unwrap();
        assert_eq!(removed, vec![dead.clone()]);
        assert!(!dead.exists() && !root.join(".weir-server-dead.lock").exists());
        assert!(alive.dir.join("staged").exists() && second.dir.exists());
        assert!(root.join("client-a").exists());
        assert!(root.join(".weir-server-elsewhere").exists());
        assert!(root.join(".weir-server-starting.lock.new").exists());
        assert_ne!(alive.dir, second.dir);
        // A server that stops cleanly takes its empty folder along; one with files keeps it
        // until a later claim finds its lock free.
        let second_dir = second.dir.clone();
        drop(second);
        assert!(!second_dir.exists());
        let alive_dir = alive.dir.clone();
        drop(alive);
        assert!(alive_dir.exists());
        let (third, removed) = ServerFolder::claim(&root).unwrap();
        assert_eq!(removed, vec![alive_dir.clone()]);
        assert!(!alive_dir.exists());
        drop(third);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn local_paths_and_file_urls_open_the_local_file_system() {
        let dir = scratch("local");
        let l = open("temp_location", dir.to_str().unwrap(), &env(&[])).unwrap();
        assert_eq!(l.kind, StoreKind::Local);
        assert_eq!(l.local.as_deref(), Some(dir.as_path()));
        assert!(dir.is_dir(), "the folder is created");
        let url = format!("file://{}", dir.join("sub").display());
        let l = open("stagingLocation", &url, &env(&[])).unwrap();
        assert_eq!(l.kind, StoreKind::Local);
        assert_eq!(l.local, Some(dir.join("sub")));
        assert_eq!(l.option.as_deref(), Some("stagingLocation"));
        assert_eq!(
            l.display(&l.path(&["job-1", "0-x.tar.gz"])),
            dir.join("sub/job-1/0-x.tar.gz").display().to_string()
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn cloud_urls_pick_their_store_when_credentials_are_configured() {
        let gcs = env(&[("GOOGLE_SKIP_SIGNATURE", "true")]);
        let l = open("temp_location", "gs://my-bucket/tmp/x/", &gcs).unwrap();
        assert_eq!(l.kind, StoreKind::Gcs);
        assert_eq!(l.prefix.as_ref(), "tmp/x");
        assert!(l.local.is_none());
        assert_eq!(
            l.display(&l.path(&["job-1", "a"])),
            "gs://my-bucket/tmp/x/job-1/a"
        );
        assert!(l.store.to_string().contains("my-bucket"), "{}", l.store);

        let s3 = env(&[
            ("AWS_ACCESS_KEY_ID", "AKIA"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
        ]);
        let l = open("tempLocation", "s3://other/", &s3).unwrap();
        assert_eq!(l.kind, StoreKind::S3);
        assert_eq!(l.prefix.as_ref(), "");
        assert_eq!(l.display(&l.path(&["a"])), "s3://other/a");
        assert!(l.store.to_string().contains("other"), "{}", l.store);
    }

    #[test]
    fn gcs_without_credentials_names_the_option_and_location() {
        let e = open(
            "temp_location",
            "gs://bucket/tmp",
            &env(&[("HOME", "/home/u")]),
        )
        .unwrap_err();
        assert_eq!(e.option, "temp_location");
        let text = e.to_string();
        assert!(
            text.starts_with("pipeline option --temp_location: gs://bucket/tmp: no Google Cloud credentials found"),
            "{text}"
        );
        assert!(text.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{text}");
        // Application default credentials or a Compute Engine VM are enough.
        let mut adc = env(&[("HOME", "/home/u")]);
        adc.files.insert(
            "/home/u/.config/gcloud/application_default_credentials.json",
            "{}",
        );
        assert_eq!(missing_gcs_credentials(&adc), None);
        let mut gce = env(&[]);
        gce.files
            .insert("/sys/class/dmi/id/product_name", "Google Compute Engine\n");
        assert_eq!(missing_gcs_credentials(&gce), None);
    }

    #[test]
    fn s3_without_credentials_names_the_option_and_location() {
        let e = open(
            "stagingLocation",
            "s3://bucket/staging",
            &env(&[("AWS_PROFILE", "dev"), ("AWS_ACCESS_KEY_ID", "only-half")]),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("pipeline option --stagingLocation: s3://bucket/staging: no AWS credentials found (AWS_PROFILE and ~/.aws/credentials are not read)"),
            "{text}"
        );
        let mut ec2 = env(&[]);
        ec2.files.insert("/sys/hypervisor/uuid", "ec2e1916-...\n");
        assert_eq!(missing_s3_credentials(&ec2), None);
    }

    #[test]
    fn bad_urls_are_refused() {
        for (bad, why) in [
            ("hdfs://nn/tmp", "scheme hdfs:// is not supported"),
            ("gs:///x", "names no bucket"),
            ("s3://", "names no bucket"),
            ("file://relative/x", "absolute local path"),
        ] {
            let e = open(
                "temp_location",
                bad,
                &env(&[("GOOGLE_SKIP_SIGNATURE", "1")]),
            )
            .unwrap_err();
            assert!(
                e.to_string()
                    .starts_with(&format!("pipeline option --temp_location: {bad}: ")),
                "{e}"
            );
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn client_staging_locations_stay_under_the_staging_root() {
        let root = scratch("policy-root");
        let temp = scratch("policy-temp");
        let defaults = Defaults {
            staging: root.clone(),
            temp: temp.clone(),
            own_staging: root.clone(),
            own_temp: temp,
            client_staging_anywhere: false,
        };
        let gcs = env(&[("GOOGLE_SKIP_SIGNATURE", "true")]);
        let with = |f: &dyn Fn(&mut JobOptions), d: &Defaults| {
            let mut o = JobOptions::default();
            f(&mut o);
            resolve(&o, d, &gcs)
        };
        // Under the root: taken, as a path or a file:// URL.
        let inside = root.join("mine");
        let l = with(
            &|o| o.staging_location = Some(inside.display().to_string()),
            &defaults,
        )
        .unwrap();
        assert_eq!(l.staging.local.as_deref(), Some(inside.as_path()));
        let url = format!("file://{}", inside.display());
        assert!(with(&|o| o.staging_location = Some(url.clone()), &defaults).is_ok());
        // Outside (also by `..`), or a bucket: refused, naming the option and the flag, no folder made.
        let outside = scratch("policy-outside");
        let escape = format!("{}/../policy-escape", root.display());
        for location in [
            outside.display().to_string(),
            escape,
            "gs://b/s".to_string(),
        ] {
            let e = with(&|o| o.staging_location = Some(location.clone()), &defaults).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "pipeline option --staging_location: {location}: outside this server's staging root {} (weir serve --allow_client_staging_locations lets clients choose)",
                    root.display()
                )
            );
        }
        assert!(!outside.exists());
        // A local temp location outside Weir's folders: the server makes no
        // folder there and keeps its own temp files in Weir's folder.
        let l = with(&|o| o.temp_location = Some(outside.display().to_string()), &defaults).unwrap();
        assert_eq!((l.temp.option.as_deref(), l.temp.local.as_deref()), (None, Some(defaults.temp.as_path())));
        assert!(!outside.exists());
        // Derived from temp_location (Python): staging stays in Weir's folder.
        let l = with(&|o| o.temp_location = Some("gs://b/t".into()), &defaults).unwrap();
        assert_eq!(l.staging.option, None);
        assert_eq!(l.temp.url, "gs://b/t");
        // Allowed by the operator: anywhere.
        let open = Defaults {
            client_staging_anywhere: true,
            ..defaults.clone()
        };
        let l = with(
            &|o| o.staging_location = Some(outside.display().to_string()),
            &open,
        )
        .unwrap();
        assert_eq!(l.staging.local.as_deref(), Some(outside.as_path()));
    }

    #[test]
    fn defaults_follow_each_sdk() {
        let defaults = Defaults {
            staging: scratch("d-staging"),
            temp: scratch("d-temp"),
            own_staging: scratch("d-staging"),
            own_temp: scratch("d-temp"),
            client_staging_anywhere: true,
        };
        let gcs = env(&[("GOOGLE_SKIP_SIGNATURE", "true")]);
        let resolve_with = |f: &dyn Fn(&mut JobOptions)| {
            let mut o = JobOptions::default();
            f(&mut o);
            resolve(&o, &defaults, &gcs).unwrap()
        };
        // Nothing given: Weir's folders.
        let l = resolve_with(&|_| {});
        assert_eq!(l.staging.option, None);
        assert_eq!(l.staging.local.as_deref(), Some(defaults.staging.as_path()));
        assert_eq!(l.temp.local.as_deref(), Some(defaults.temp.as_path()));
        // Python: staging defaults to temp.
        let l = resolve_with(&|o| o.temp_location = Some("gs://b/t".into()));
        assert_eq!(
            (l.staging.url.as_str(), l.temp.url.as_str()),
            ("gs://b/t", "gs://b/t")
        );
        assert_eq!(l.staging.option.as_deref(), Some("temp_location"));
        // Java: stagingLocation defaults to gcpTempLocation/staging.
        let l = resolve_with(&|o| {
            o.gcp_temp_location = Some("gs://b/g/".into());
            o.spellings
                .insert("gcp_temp_location", "gcpTempLocation".into());
        });
        assert_eq!(l.staging.url, "gs://b/g/staging");
        assert_eq!(l.staging.option.as_deref(), Some("gcpTempLocation"));
        assert_eq!(l.temp.url, "gs://b/g/");
        // Go: temp defaults to staging/tmp.
        let l = resolve_with(&|o| o.staging_location = Some("gs://b/s".into()));
        assert_eq!(
            (l.staging.url.as_str(), l.temp.url.as_str()),
            ("gs://b/s", "gs://b/s/tmp")
        );
        // Both given: each its own.
        let l = resolve_with(&|o| {
            o.staging_location = Some("gs://b/s".into());
            o.temp_location = Some("gs://b/t".into());
        });
        assert_eq!(
            (l.staging.url.as_str(), l.temp.url.as_str()),
            ("gs://b/s", "gs://b/t")
        );
        let _ = std::fs::remove_dir_all(&defaults.staging);
        let _ = std::fs::remove_dir_all(&defaults.temp);
    }

    #[tokio::test]
    async fn probe_writes_and_removes_in_memory() {
        let l = Location {
            option: Some("temp_location".into()),
            url: "gs://b/t".into(),
            kind: StoreKind::Gcs,
            store: Arc::new(InMemory::new()),
            prefix: Path::from("t"),
            local: None,
        };
        l.probe("job-1").await.unwrap();
        use futures::TryStreamExt;
        let left: Vec<_> = l.store.list(None).try_collect().await.unwrap();
        assert!(left.is_empty(), "{left:?}");
        l.store
            .put(&l.path(&["job-1", "a"]), PutPayload::from_static(b"x"))
            .await
            .unwrap();
        l.store
            .put(&l.path(&["job-2", "a"]), PutPayload::from_static(b"y"))
            .await
            .unwrap();
        l.remove_job_folder("job-1").await;
        let left: Vec<String> = l
            .store
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        assert_eq!(left, vec!["t/job-2/a".to_string()]);
    }

    #[tokio::test]
    async fn unreachable_bucket_fails_the_probe_naming_the_option() {
        // An S3 endpoint on a closed local port stands in for a bucket that
        // cannot be reached (no real cloud is contacted).
        let (client, retry) = cloud_client();
        let store = AmazonS3Builder::new()
            .with_bucket_name("nope")
            .with_region("us-east-1")
            .with_access_key_id("AKIA")
            .with_secret_access_key("secret")
            .with_endpoint("http://127.0.0.1:1")
            .with_allow_http(true)
            .with_client_options(client)
            .with_retry(RetryConfig {
                max_retries: 0,
                ..retry
            })
            .build()
            .unwrap();
        let l = Location {
            option: Some("staging_location".into()),
            url: "s3://nope/x".into(),
            kind: StoreKind::S3,
            store: Arc::new(store),
            prefix: Path::from("x"),
            local: None,
        };
        let e = l.probe("job").await.unwrap_err();
        assert!(
            e.starts_with("pipeline option --staging_location: s3://nope/x: cannot write there: "),
            "{e}"
        );
    }
}
