//! Resolves `--model` to a checkpoint folder: a local folder, or a Hugging Face Hub repo id
//! looked up in (and downloaded into) the standard HF cache, so that files fetched by mlx-lm or
//! huggingface-cli are reused and ours are reused by them.

mod cache;
#[cfg(feature = "hub")]
mod download;
#[cfg(feature = "hub")]
mod http;
#[cfg(feature = "hub")]
mod listing;
#[cfg(feature = "hub")]
mod lock;
#[cfg(feature = "hub")]
mod mtp_head;
mod names;

use anyhow::{bail, Context, Result};
use cache::RepoCache;
use names::{check_repo_file, check_revision};
use qwen_gdn_model::weights::drafter_folder::declares_a_drafter;
use std::path::{Path, PathBuf};

/// Files a checkpoint folder must have before the weights are opened.
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
/// Fetched when the repo has them; everything else in a repo (README, images, ...) is skipped.
const OPTIONAL: [&str; 3] = [
    "generation_config.json",
    "tokenizer_config.json",
    "chat_template.jinja",
];
const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// Returns the folder holding config.json, the tokenizer and the weights.
pub fn resolve(model: &str, revision: Option<&str>) -> Result<PathBuf> {
    let path = expand_home(model);
    if path.is_dir() {
        if revision.is_some() {
            bail!("--revision only applies to Hub repo ids, but --model {model} is a local folder");
        }
        check_folder(&path)?;
        return Ok(path);
    }
    if path.exists() {
        bail!("--model {model} is a file; pass the folder that holds config.json");
    }
    if !is_repo_id(model) {
        bail!("model folder {model} does not exist");
    }
    let dir = HubEnv::from_env()
        .resolve(model, revision.unwrap_or("main"))
        .with_context(|| format!("--model {model} (not a local folder, so a Hub repo id)"))?;
    check_folder(&dir)?;
    Ok(dir)
}

/// Where `--mtp-from` found the multi-token-prediction head.
pub enum MtpSource {
    /// A folder whose safetensors hold `mtp.*` tensors (a local checkpoint, or the head
    /// assembled from a Hub repo's byte ranges), or mlx-vlm's separate drafter (a local
    /// folder, or a whole Hub repo of one).
    Folder(PathBuf),
    /// The Hub repo has no `mtp.*` tensors.
    Absent(String),
}

/// `--mtp-from`: a local checkpoint folder as it is, or a Hub repo whose `mtp.*` tensors alone
/// are fetched (by byte range) into the cache.
pub fn resolve_mtp_from(source: &str) -> Result<MtpSource> {
    let path = expand_home(source);
    if path.is_dir() {
        return Ok(MtpSource::Folder(path));
    }
    if path.exists() || !is_repo_id(source) {
        bail!("--mtp-from {source}: neither a checkpoint folder nor a Hub repo id");
    }
    HubEnv::from_env()
        .mtp_head(source, "main")
        .with_context(|| format!("--mtp-from {source}"))
}

/// Whether `--draft-model`'s `source` is mlx-vlm's separate MTP drafter (config.json's
/// `model_type: qwen4_exp_mtp`) rather than a model: a folder's config.json, or a Hub repo's,
/// fetched alone (or read from the cache when offline or the Hub is away). Anything else
/// (no such folder, no config.json) answers `false`, and loading it as a model says why.
pub fn names_a_drafter(source: &str) -> Result<bool> {
    let path = expand_home(source);
    if path.is_dir() {
        return Ok(declares_a_drafter(&path));
    }
    if path.exists() || !is_repo_id(source) {
        return Ok(false);
    }
    HubEnv::from_env()
        .repo_declares_a_drafter(source, "main")
        .with_context(|| format!("--draft-model {source}"))
}

fn check_folder(dir: &Path) -> Result<()> {
    for file in REQUIRED {
        if !dir.join(file).is_file() {
            bail!("model folder {} has no {file}", dir.display());
        }
    }
    Ok(())
}

fn expand_home(model: &str) -> PathBuf {
    match (model.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(model),
    }
}

/// `org/name` with Hub-legal characters; anything else that does not exist is a missing folder.
fn is_repo_id(s: &str) -> bool {
    let legal = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    matches!(s.split_once('/'), Some((org, name)) if legal(org) && legal(name))
}

/// What the Hub client takes from the environment, read in one place (tests build it directly).
#[cfg_attr(not(feature = "hub"), allow(dead_code))] // token and endpoint serve downloads only
struct HubEnv {
    cache: PathBuf,
    offline: bool,
    token: Option<String>,
    endpoint: Option<String>,
}

impl HubEnv {
    /// huggingface_hub's rules: HF_HUB_CACHE, else $HF_HOME/hub, else
    /// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; the token from
    /// HF_TOKEN, else $HF_HOME/token. (The timeouts are read by the download client.)
    fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let cache = var("XDG_CACHE_HOME").map(PathBuf::from);
            cache
                .unwrap_or_else(|| expand_home("~/.cache"))
                .join("huggingface")
        });
        let token = var("HF_TOKEN").or_else(|| {
            let file = std::fs::read_to_string(home.join("token")).ok()?;
            Some(file.trim().to_string()).filter(|t| !t.is_empty())
        });
        let offline = var("HF_HUB_OFFLINE")
            .is_some_and(|v| ["1", "on", "yes", "true"].contains(&v.to_lowercase().as_str()));
        Self {
            cache: var("HF_HUB_CACHE")
                .map(PathBuf::from)
                .unwrap_or(home.join("hub")),
            offline,
            token,
            endpoint: var("HF_ENDPOINT"),
        }
    }

    fn resolve(&self, repo: &str, revision: &str) -> Result<PathBuf> {
        check_revision(revision)?;
        if self.offline {
            return self.cached(repo, revision).map_err(|e| {
                anyhow::anyhow!(
                    "{e:#} (HF_HUB_OFFLINE=1 reads only the cache: fetch the model once online, \
                     or pass a local folder)"
                )
            });
        }
        self.download(repo, revision)
    }

    /// [`names_a_drafter`] for `repo@revision`: its config.json alone, from the Hub or the cache.
    #[cfg(feature = "hub")]
    fn repo_declares_a_drafter(&self, repo: &str, revision: &str) -> Result<bool> {
        check_revision(revision)?;
        let cache = RepoCache::new(&self.cache, repo);
        let from_cache = || -> Result<bool> {
            let commit = cache.commit_of(revision)?;
            Ok(commit.is_some_and(|c| declares_a_drafter(&cache.snapshot(&c))))
        };
        if self.offline {
            return from_cache();
        }
        let (http, listing) = match self.list(repo, revision)? {
            Ok(listed) => listed,
            Err(_away) => return from_cache(),
        };
        if !listing.files.contains("config.json") {
            return Ok(false);
        }
        let config = download::fetch(&http, &cache, repo, &listing.commit, "config.json")?;
        Ok(config.parent().is_some_and(declares_a_drafter))
    }

    #[cfg(not(feature = "hub"))]
    fn repo_declares_a_drafter(&self, _repo: &str, _revision: &str) -> Result<bool> {
        Ok(false)
    }

    #[cfg(not(feature = "hub"))]
    fn mtp_head(&self, repo: &str, _revision: &str) -> Result<MtpSource> {
        bail!("{repo}: this qwen-gdn was built without the `hub` feature; pass a local folder")
    }

    #[cfg(feature = "hub")]
    fn mtp_head(&self, repo: &str, revision: &str) -> Result<MtpSource> {
        let cache = RepoCache::new(&self.cache, repo);
        let from_cache = || -> Result<MtpSource> {
            let commit = cache.commit_of(revision)?;
            // A head assembled from byte ranges, or a whole drafter repo fetched before.
            let drafter = || {
                self.cached(repo, revision)
                    .ok()
                    .filter(|d| declares_a_drafter(d))
            };
            match commit
                .and_then(|c| mtp_head::cached(&cache, &c))
                .or_else(drafter)
            {
                Some(dir) => Ok(MtpSource::Folder(dir)),
                None => bail!(
                    "the MTP head of {repo}@{revision} is not in the Hugging Face cache {}",
                    self.cache.display()
                ),
            }
        };
        if self.offline {
            return from_cache()
                .map_err(|e| anyhow::anyhow!("{e:#} (HF_HUB_OFFLINE=1 reads only the cache)"));
        }
        let (http, listing) = match self.list(repo, revision)? {
            Ok(listed) => listed,
            Err(away) => return from_cache().map_err(|c| anyhow::anyhow!("{away}, and {c:#}")),
        };
        let found = mtp_head::fetch(&http, &cache, repo, &listing.commit, &listing.files)?;
        let absent = || {
            MtpSource::Absent(format!(
                "{repo}@{revision} has no MTP head (no mtp.* tensors)"
            ))
        };
        if let mtp_head::Head::NotAModel = found {
            // mlx-vlm's separate drafter is the head and nothing else (small): all of it.
            if listing.files.contains("config.json") {
                let config = download::fetch(&http, &cache, repo, &listing.commit, "config.json")?;
                if config.parent().is_some_and(declares_a_drafter) {
                    return self.download(repo, revision).map(MtpSource::Folder);
                }
            }
        }
        cache.write_ref(revision, &listing.commit)?;
        Ok(match found {
            mtp_head::Head::Found(dir) => MtpSource::Folder(dir),
            mtp_head::Head::Absent | mtp_head::Head::NotAModel => absent(),
        })
    }

    #[cfg(feature = "hub")]
    fn endpoint(&self) -> &str {
        self.endpoint.as_deref().unwrap_or("https://huggingface.co")
    }

    /// The Hub's client and its listing of `repo@revision`; `Err` of "cannot reach <endpoint>
    /// (why)" where the Hub cannot be reached, for the caller to try its cache (a refusal is an
    /// error of its own).
    #[cfg(feature = "hub")]
    fn list(
        &self,
        repo: &str,
        revision: &str,
    ) -> Result<Result<(http::Http, listing::Listing), String>> {
        let endpoint = self.endpoint();
        let http = http::Http::new(endpoint, self.token.clone())?;
        match listing::fetch(&http, repo, revision) {
            Ok(listing) => Ok(Ok((http, listing))),
            Err(listing::Failure::Refused(e)) => bail!("{e}"),
            Err(listing::Failure::Unreachable(e)) => {
                Ok(Err(format!("cannot reach {endpoint} ({e})")))
            }
        }
    }

    /// Cache lookup only: no network.
    fn cached(&self, repo: &str, revision: &str) -> Result<PathBuf> {
        let cache = RepoCache::new(&self.cache, repo);
        let snapshot = cache.commit_of(revision)?.map(|c| cache.snapshot(&c));
        fetch_checkpoint(&mut |file, required| {
            let path = snapshot
                .as_ref()
                .map(|s| s.join(file))
                .filter(|p| p.is_file());
            if path.is_none() && required {
                bail!(
                    "{file} of {repo}@{revision} is not in the Hugging Face cache {}",
                    self.cache.display()
                );
            }
            Ok(path)
        })
    }

    #[cfg(not(feature = "hub"))]
    fn download(&self, repo: &str, revision: &str) -> Result<PathBuf> {
        self.cached(repo, revision).map_err(|e| {
            anyhow::anyhow!(
                "{e:#} (this qwen-gdn was built without the `hub` feature: fetch the model with \
                 huggingface-cli, or pass a local folder)"
            )
        })
    }

    #[cfg(feature = "hub")]
    fn download(&self, repo: &str, revision: &str) -> Result<PathBuf> {
        // One listing call tells which optional files exist (no 404 probing) and the commit
        // whose snapshot may already be cached.
        let (http, listing) = match self.list(repo, revision)? {
            Ok(listed) => listed,
            Err(away) => {
                // As with huggingface_hub, a complete cached copy works while the Hub is away.
                return self.cached(repo, revision).map_err(|cache_err| {
                    anyhow::anyhow!(
                        "{away}, and {cache_err:#}; once the model is cached, HF_HUB_OFFLINE=1 \
                         runs without the network; or pass a local folder"
                    )
                });
            }
        };
        if names::is_commit(revision) && listing.commit != revision {
            bail!(
                "{} listed commit {} for --revision {revision}",
                self.endpoint(),
                listing.commit
            );
        }
        let cache = RepoCache::new(&self.cache, repo);
        let snapshot = cache.snapshot(&listing.commit);
        let dir = fetch_checkpoint(&mut |file, required| {
            if !listing.files.contains(file) {
                if required {
                    bail!("{repo}@{revision} on the Hub has no {file}");
                }
                return Ok(None);
            }
            let path = snapshot.join(file);
            if path.is_file() {
                return Ok(Some(path));
            }
            download::fetch(&http, &cache, repo, &listing.commit, file)
                .with_context(|| format!("{repo}@{revision}"))
                .map(Some)
        })?;
        // Only a complete snapshot becomes what the revision names, so an offline run never
        // meets a half-fetched one where a whole older one exists.
        cache.write_ref(revision, &listing.commit)?;
        Ok(dir)
    }
}

/// Fetches what a checkpoint needs through `fetch(file, required)` and returns the folder of
/// config.json. Shards are listed by the safetensors index, so nothing else is downloaded.
fn fetch_checkpoint(
    fetch: &mut dyn FnMut(&str, bool) -> Result<Option<PathBuf>>,
) -> Result<PathBuf> {
    let config = fetch("config.json", true)?.context("config.json")?;
    let dir = config
        .parent()
        .context("config.json has no parent folder")?
        .to_path_buf();
    fetch("tokenizer.json", true)?;
    for file in OPTIONAL {
        fetch(file, false)?;
    }
    match fetch(INDEX, false)? {
        Some(index) => {
            for shard in shard_names(&index)? {
                fetch(&shard, true)?;
            }
        }
        None => {
            fetch(SINGLE, true)?;
        }
    }
    Ok(dir)
}

/// Unique shard file names of a `model.safetensors.index.json`, in first-seen order.
fn shard_names(index: &Path) -> Result<Vec<String>> {
    shard_names_of(index, |_| true)
}

/// Unique shard file names that the index maps a tensor name passing `wanted` to, in
/// first-seen order.
fn shard_names_of(index: &Path, wanted: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let read = || -> Result<Vec<String>> {
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(index)?)?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .context("no \"weight_map\" object")?;
        let mut names: Vec<String> = Vec::new();
        for (key, file) in map {
            let file = file
                .as_str()
                .context("a weight_map value is not a string")?;
            // The index comes from the repo: its names are joined onto the snapshot folder.
            check_repo_file(file).map_err(anyhow::Error::msg)?;
            if wanted(key) && !names.iter().any(|n| n == file) {
                names.push(file.to_string());
            }
        }
        Ok(names)
    };
    read().with_context(|| format!("reading {}", index.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    /// A cache laid out like huggingface_hub's: refs/main -> snapshots/<sha>/files.
    fn fake_cache(files: &[&str]) -> (tempfile::TempDir, HubEnv) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("models--org--tiny");
        let snap = root.join("snapshots").join(SHA);
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(root.join("refs")).unwrap();
        std::fs::write(root.join("refs/main"), SHA).unwrap();
        for f in files {
            let body = if *f == INDEX {
                r#"{"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s1.safetensors"}}"#
            } else {
                "{}"
            };
            std::fs::write(snap.join(f), body).unwrap();
        }
        let env = HubEnv {
            cache: tmp.path().to_path_buf(),
            offline: true,
            token: None,
            endpoint: None,
        };
        (tmp, env)
    }

    #[test]
    fn offline_cache_hit_resolves_to_the_snapshot() {
        let (tmp, env) = fake_cache(&[
            "config.json",
            "tokenizer.json",
            INDEX,
            "s1.safetensors",
            "s2.safetensors",
        ]);
        let dir = env.resolve("org/tiny", "main").unwrap();
        assert_eq!(
            dir,
            tmp.path().join("models--org--tiny/snapshots").join(SHA)
        );
        // A commit sha needs no ref.
        assert_eq!(env.resolve("org/tiny", SHA).unwrap(), dir);
    }

    #[test]
    fn offline_cache_miss_names_the_file() {
        let (_tmp, env) = fake_cache(&["config.json", "tokenizer.json", INDEX, "s1.safetensors"]);
        let err = format!("{:#}", env.resolve("org/tiny", "main").unwrap_err());
        assert!(
            err.contains("s2.safetensors of org/tiny@main is not in the Hugging Face cache"),
            "{err}"
        );
        assert!(err.contains("HF_HUB_OFFLINE"), "{err}");
        let err = format!("{:#}", env.resolve("org/other", "main").unwrap_err());
        assert!(err.contains("config.json of org/other@main"), "{err}");
    }

    #[test]
    fn single_file_checkpoint() {
        let (_tmp, env) = fake_cache(&["config.json", "tokenizer.json", SINGLE]);
        assert!(env.resolve("org/tiny", "main").is_ok());
    }

    #[test]
    fn repo_ids() {
        assert!(is_repo_id("mlx-community/Qwen3-Next-80B-A3B-Instruct-4bit"));
        for s in [
            "models", "./a/b", "/a/b", "~/a/b", "a/b/c", "a/", "/b", "a b/c", "../x",
        ] {
            assert!(!is_repo_id(s), "{s}");
        }
    }
}
