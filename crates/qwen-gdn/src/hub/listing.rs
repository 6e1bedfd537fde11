//! The repo listing (`/api/models/<repo>/revision/<revision>`): the commit a revision is at
//! and the files it has, both checked before any becomes part of a path.

use super::http::{encode, Follow, Http, Purpose};
use super::names::{check_repo_file, is_commit};
use std::collections::HashSet;
use std::io::Read;

pub struct Listing {
    pub commit: String,
    pub files: HashSet<String>,
}

pub enum Failure {
    /// The Hub answered, and no: a wrong repo or revision, a missing token, or an answer
    /// that cannot be trusted. Running from the cache would hide the mistake.
    Refused(String),
    /// No answer: the cache may stand in.
    Unreachable(String),
}

/// A listing is a few kilobytes even for the largest checkpoints.
const MAX_LISTING_BYTES: u64 = 64 << 20;

pub fn fetch(http: &Http, repo: &str, revision: &str) -> Result<Listing, Failure> {
    let url = format!(
        "{}/api/models/{repo}/revision/{}",
        http.endpoint,
        encode(revision, false)
    );
    let (response, answered) = http
        .send(Purpose::Metadata, false, &url, None, Follow::All)
        .map_err(Failure::Unreachable)?;
    let status = response.status();
    if !status.is_success() {
        return Err(Failure::Refused(format!(
            "{} answered {status} for {repo}@{revision}: check the repo id and --revision \
             (gated or private repos need HF_TOKEN)",
            http.endpoint
        )));
    }
    let mut body = Vec::new();
    response
        .into_body()
        .into_reader()
        .take(MAX_LISTING_BYTES)
        .read_to_end(&mut body)
        .map_err(|e| {
            Failure::Unreachable(format!(
                "{answered}: {}",
                http.describe_read_error(Purpose::Metadata, &e)
            ))
        })?;
    parse(&body).map_err(|why| Failure::Refused(format!("the listing {answered} {why}")))
}

fn parse(body: &[u8]) -> Result<Listing, String> {
    #[derive(serde::Deserialize)]
    struct Json {
        sha: String,
        siblings: Vec<Sibling>,
    }
    #[derive(serde::Deserialize)]
    struct Sibling {
        rfilename: String,
    }
    let json: Json =
        serde_json::from_slice(body).map_err(|e| format!("is not a repo listing ({e})"))?;
    if !is_commit(&json.sha) {
        return Err(format!(
            "gives commit {:?}, which is not a commit id",
            json.sha
        ));
    }
    let mut files = HashSet::new();
    for sibling in json.siblings {
        check_repo_file(&sibling.rfilename).map_err(|why| format!("lists a {why}"))?;
        files.insert(sibling.rfilename);
    }
    Ok(Listing {
        commit: json.sha,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_listings() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let ok = format!(r#"{{"sha": "{sha}", "siblings": [{{"rfilename": "a/b.json"}}]}}"#);
        let listing = parse(ok.as_bytes()).ok().unwrap();
        assert!(listing.files.contains("a/b.json"));
        let bad_sha = r#"{"sha": "../../../../tmp/x", "siblings": []}"#;
        assert!(parse(bad_sha.as_bytes())
            .err()
            .unwrap()
            .contains("not a commit id"));
        let bad_name =
            format!(r#"{{"sha": "{sha}", "siblings": [{{"rfilename": "../../x.json"}}]}}"#);
        assert!(parse(bad_name.as_bytes())
            .err()
            .unwrap()
            .contains("../../x.json"));
    }
}
