//! The header rank 0 sends each other rank before a turn of `chat` or a request of `serve`
//! over ranks: what the turn is (or that the session ended), how many prompt tokens and
//! message boundaries follow, and the settings every rank must decode with (seed, token
//! limit, sampling). Sent as u32 values (floats by their bits), since the collective carries
//! f32 buffers.

use crate::engine::sampler::SamplerConfig;
use crate::engine::GenerateParams;
use anyhow::{bail, Context, Result};

/// Values in a header.
pub const HEADER_LEN: usize = 14;

const END: u32 = 0;
const TURN: u32 = 1;

/// What rank 0 announces.
#[derive(Debug, Clone)]
pub enum TurnMessage {
    /// A turn: its prompt's token and boundary counts (sent next), and how to decode it. The
    /// stop strings stay on rank 0 (the only rank with the text), which ends the turn on
    /// every rank through its stop flag.
    Turn {
        ids: usize,
        boundaries: usize,
        params: GenerateParams,
    },
    /// The session is over: the ranks end.
    End,
}

impl TurnMessage {
    pub fn encode(&self) -> Result<[u32; HEADER_LEN]> {
        let count = |n: usize| u32::try_from(n).context("a prompt of more than 2^32 tokens");
        let (ids, boundaries, params) = match self {
            Self::End => return Ok([END, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Self::Turn {
                ids,
                boundaries,
                params,
            } => (*ids, *boundaries, params),
        };
        let seed = params
            .seed
            .context("a turn over ranks needs its seed drawn")?;
        let s = &params.sampler;
        Ok([
            TURN,
            count(ids)?,
            count(boundaries)?,
            seed as u32,
            (seed >> 32) as u32,
            count(params.max_tokens)?,
            s.temp.to_bits(),
            s.top_p.to_bits(),
            s.min_p.to_bits(),
            count(s.top_k)?,
            s.repetition_penalty.unwrap_or(f32::NAN).to_bits(),
            s.presence_penalty.to_bits(),
            s.frequency_penalty.to_bits(),
            count(s.repetition_context_size)?,
        ])
    }

    pub fn decode(header: &[u32]) -> Result<Self> {
        let Ok(h) = <[u32; HEADER_LEN]>::try_from(header) else {
            bail!("rank 0 sent a turn header of {} values", header.len());
        };
        match h[0] {
            END => return Ok(Self::End),
            TURN => {}
            kind => bail!("rank 0 sent a message of unknown kind {kind}"),
        }
        let float = f32::from_bits;
        let repetition_penalty = Some(float(h[10])).filter(|p| !p.is_nan());
        Ok(Self::Turn {
            ids: h[1] as usize,
            boundaries: h[2] as usize,
            params: GenerateParams {
                max_tokens: h[5] as usize,
                sampler: SamplerConfig {
                    temp: float(h[6]),
                    top_p: float(h[7]),
                    min_p: float(h[8]),
                    top_k: h[9] as usize,
                    repetition_penalty,
                    presence_penalty: float(h[11]),
                    frequency_penalty: float(h[12]),
                    repetition_context_size: h[13] as usize,
                },
                seed: Some(u64::from(h[3]) | (u64::from(h[4]) << 32)),
                stop_strings: Vec::new(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_and_the_end_come_back_as_sent() {
        let params = GenerateParams {
            max_tokens: 77,
            sampler: SamplerConfig {
                temp: 0.8,
                top_p: 0.95,
                min_p: 0.05,
                top_k: 40,
                repetition_penalty: Some(1.1),
                presence_penalty: 0.5,
                frequency_penalty: -0.25,
                repetition_context_size: 20,
            },
            seed: Some(0x1234_5678_9abc_def0),
            stop_strings: Vec::new(),
        };
        let turn = TurnMessage::Turn {
            ids: 300,
            boundaries: 3,
            params: params.clone(),
        };
        let back = TurnMessage::decode(&turn.encode().unwrap()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{turn:?}"));
        let mut unpenalised = params;
        unpenalised.sampler.repetition_penalty = None;
        let turn = TurnMessage::Turn {
            ids: 1,
            boundaries: 0,
            params: unpenalised,
        };
        let back = TurnMessage::decode(&turn.encode().unwrap()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{turn:?}"));
        let end = TurnMessage::decode(&TurnMessage::End.encode().unwrap()).unwrap();
        assert!(matches!(end, TurnMessage::End));
        assert!(TurnMessage::decode(&[7; HEADER_LEN]).is_err());
        assert!(TurnMessage::decode(&[1; 5]).is_err());
    }
}
