//! How a launcher tells each process it starts which rank of which job it is (`--ranks N` on
//! one host with several CUDA GPUs: `rank_launch.rs`); read by every build, so that a rank of a
//! build without NCCL says so in one line.

use anyhow::{anyhow, ensure, Result};

/// The job this process is one rank of, as a launcher describes it to each rank it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclRankEnv {
    pub rank: usize,
    pub ranks: usize,
    /// The communicator's id, made once by the launcher (`nccl_world::new_job_id`), 128 bytes in hex.
    pub id_hex: String,
}

/// The variables a launcher sets in every rank it starts.
pub const RANK_VAR: &str = "QWEN_GDN_RANK";
pub const RANKS_VAR: &str = "QWEN_GDN_RANKS";
pub const NCCL_ID_VAR: &str = "QWEN_GDN_NCCL_ID";

impl NcclRankEnv {
    /// This process's place in an NCCL job, from the launcher's variables; `None` outside one.
    /// Variables present but malformed are an error naming the variable.
    pub fn from_env() -> Result<Option<Self>> {
        parse(|name| std::env::var(name).ok())
    }

    /// The id's 128 bytes (checked as 256 hex digits in [`NcclRankEnv::from_env`]).
    pub fn id_bytes(&self) -> [u8; 128] {
        let mut bytes = [0u8; 128];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&self.id_hex[2 * i..2 * i + 2], 16).unwrap_or(0);
        }
        bytes
    }
}

/// [`NcclRankEnv::from_env`] over `var` (a variable's value by name).
fn parse(var: impl Fn(&str) -> Option<String>) -> Result<Option<NcclRankEnv>> {
    let Some(id_hex) = var(NCCL_ID_VAR) else {
        return Ok(None);
    };
    let number = |name: &str| -> Result<usize> {
        let text = var(name).ok_or_else(|| anyhow!("{NCCL_ID_VAR} is set but {name} is not"))?;
        text.parse()
            .map_err(|_| anyhow!("{name}={text}: expected a rank number"))
    };
    let (rank, ranks) = (number(RANK_VAR)?, number(RANKS_VAR)?);
    ensure!(
        ranks >= 1 && rank < ranks,
        "{RANK_VAR}={rank} is not a rank of {RANKS_VAR}={ranks}"
    );
    ensure!(
        id_hex.len() == 256 && id_hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{NCCL_ID_VAR}: expected 256 hex digits (an NCCL unique id), got {} characters",
        id_hex.len()
    );
    Ok(Some(NcclRankEnv {
        rank,
        ranks,
        id_hex,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<Option<NcclRankEnv>> {
        parse(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn a_launched_rank_reads_its_place_and_refuses_bad_values() {
        let id = "ab".repeat(128);
        assert_eq!(with(&[]).unwrap(), None);
        let env = with(&[(NCCL_ID_VAR, &id), (RANK_VAR, "1"), (RANKS_VAR, "2")])
            .unwrap()
            .unwrap();
        assert_eq!((env.rank, env.ranks), (1, 2));
        assert_eq!(env.id_bytes(), [0xab; 128]);
        let err = |vars: &[(&str, &str)]| with(vars).unwrap_err().to_string();
        assert_eq!(
            err(&[(NCCL_ID_VAR, &id), (RANK_VAR, "2"), (RANKS_VAR, "2")]),
            "QWEN_GDN_RANK=2 is not a rank of QWEN_GDN_RANKS=2"
        );
        assert_eq!(
            err(&[(NCCL_ID_VAR, &id), (RANKS_VAR, "2")]),
            "QWEN_GDN_NCCL_ID is set but QWEN_GDN_RANK is not"
        );
        assert_eq!(
            err(&[(NCCL_ID_VAR, &id), (RANK_VAR, "x"), (RANKS_VAR, "2")]),
            "QWEN_GDN_RANK=x: expected a rank number"
        );
        assert_eq!(
            err(&[(NCCL_ID_VAR, "12"), (RANK_VAR, "0"), (RANKS_VAR, "2")]),
            "QWEN_GDN_NCCL_ID: expected 256 hex digits (an NCCL unique id), got 2 characters"
        );
    }
}
