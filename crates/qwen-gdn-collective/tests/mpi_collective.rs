//! The MPI collectives checked between real processes. Run under `mpirun -np N` (the CI runs
//! 2 and 3 ranks, scripts/test-mpi.sh); alone, it is a world of one rank and still checks the
//! single-rank case. One test function: MPI is initialized once per process.

use qwen_gdn_collective::{ensure_same_fingerprint, split_layers, Collective, MpiWorld};

#[test]
fn collectives_between_ranks() {
    let world = MpiWorld::init().unwrap();
    let (rank, size) = (world.rank(), world.size());

    // Ring: each rank sends its activation-like buffer to the next and checks the previous one's.
    let row = |r: usize| {
        (0..257)
            .map(|i| (r * 1000 + i) as f32 * 0.5)
            .collect::<Vec<f32>>()
    };
    if size > 1 {
        let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
        let mut got = vec![0f32; 257];
        // Even ranks send first, odd ranks receive first: blocking sends cannot deadlock.
        if rank % 2 == 0 {
            world.send(next, &row(rank)).unwrap();
            world.receive(prev, &mut got).unwrap();
        } else {
            world.receive(prev, &mut got).unwrap();
            world.send(next, &row(rank)).unwrap();
        }
        assert_eq!(
            got,
            row(prev),
            "rank {rank} got the wrong buffer from rank {prev}"
        );
        // A wrong-length receive is an error naming the sender, not silent truncation.
        if rank == 0 {
            world.send(1, &[1.0, 2.0]).unwrap();
        } else if rank == 1 {
            let err = world.receive(0, &mut [0f32; 3]).unwrap_err().to_string();
            assert!(err.contains("rank 0 sent 2 values"), "{err}");
        }
    }

    // Sum over ranks equals the closed form.
    let mut values: Vec<f32> = (0..5).map(|i| (rank + i) as f32).collect();
    world.all_reduce_sum(&mut values).unwrap();
    let expected: Vec<f32> = (0..5)
        .map(|i| (0..size).map(|r| (r + i) as f32).sum())
        .collect();
    assert_eq!(values, expected);

    // Agreement: the same hash passes; one rank with another hash fails on every rank, naming it.
    ensure_same_fingerprint(&world, 0xfeed, "config and tensors").unwrap();
    if size > 1 {
        let mine = if rank == size - 1 { 0xbad } else { 0xfeed };
        let err = ensure_same_fingerprint(&world, mine, "config and tensors")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("rank {} disagrees", size - 1)),
            "{err}"
        );
    }

    // Every rank computes the same layout.
    let stages = split_layers(7, size).unwrap();
    let all = world
        .all_gather_u64(stages[rank].layers.start as u64)
        .unwrap();
    assert_eq!(
        all,
        stages
            .iter()
            .map(|s| s.layers.start as u64)
            .collect::<Vec<_>>()
    );
}
