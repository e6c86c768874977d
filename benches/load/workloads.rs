//! The main run's steps: the servers it starts, and each workload it drives against them in alternating
//! stretches, one per part of the report.

use super::*;

/// The servers of the main run and the connections to each; dropping it stops the servers.
pub(crate) struct Bench {
    gate: Server,
    trivial: Server,
    /// `None` when `redis-server` is not installed: the Redis rows are skipped.
    redis: Option<Server>,
    gate_clients: Clients,
    trivial_clients: Clients,
    redis_connections: Option<RedisConnections>,
    /// The gate's configuration file, kept until the gate has stopped.
    _config: tempfile::NamedTempFile,
}

/// The 1,000-key batch comparison, whose samples the sweep and the targets read again.
pub(crate) struct BatchLookups {
    pub(crate) gate_keyed: Sample,
    pub(crate) trivial_keyed: Sample,
    pub(crate) gate_packed: Sample,
    pub(crate) trivial_packed: Sample,
    /// Redis `GETBIT` pipelines probing the same keys, if Redis ran.
    pub(crate) getbit: Option<Sample>,
}

// The steps of the run, in its order.
impl Bench {
    /// Starts the gate, the trivial tonic server and Redis (if installed), each its own process, and
    /// connects to each; notes the gate's configuration and Redis' version in the report.
    pub(crate) async fn start(report: &mut Report) -> Self {
        let config = tempfile::NamedTempFile::new().expect("a temporary file");
        std::fs::write(config.path(), gate_config()).expect("writing the configuration");
        report.config = gate_config();

        let gate = procs::start_gate(&procs::gate_binary(), config.path(), None);
        let trivial = baseline::start();
        let redis = procs::start_redis();
        if redis.is_none() {
            eprintln!("redis-server is not installed (apt-get install -y redis-server): Redis rows are skipped");
        }
        report.redis_version = redis.as_ref().map(|_| procs::redis_version());
        let gate_clients = connect(&gate).await;
        let trivial_clients = connect(&trivial).await;
        let redis_connections = match &redis {
            Some(redis) => Some(connect_redis(redis).await),
            None => None,
        };
        println!(
            "servers: gate {} (pid {}), trivial tonic {} (pid {}){}",
            gate.addr,
            gate.pid(),
            trivial.addr,
            trivial.pid(),
            redis.as_ref().map_or(String::new(), |r| format!(
                ", redis {} (pid {})",
                r.addr,
                r.pid()
            ))
        );
        Self {
            gate,
            trivial,
            redis,
            gate_clients,
            trivial_clients,
            redis_connections,
            _config: config,
        }
    }

    /// Fills `default` with `FILLED_KEYS` keys, measuring the Adds (keys/s, server CPU per key) and the
    /// gate's RSS empty and filled; then fills, unmeasured, the namespaces later steps look up or write to.
    pub(crate) async fn fill_namespaces(&self, report: &mut Report) {
        let rss_empty = self.gate.rss_bytes();
        println!("filling: {FILLED_KEYS} keys into `default` in Adds of {ADD_BATCH}...");
        let filled = fill(
            &self.gate_clients,
            &self.gate,
            "default",
            PRESENT,
            FILLED_KEYS,
        )
        .await;
        println!(
            "  {:.1} s, {:.2} M keys/s, {:.3} µs server CPU per key",
            filled.wall,
            filled.keys_per_second() / 1e6,
            filled.server_us_per_key()
        );
        let rss_filled = self.gate.rss_bytes();
        let default_stats = stats(&self.gate, "default").await;
        for (namespace, base, count) in [
            ("writes", WRITES, WRITE_CANDIDATES),
            ("tomb", TOMB, TOMBSTONE_LOOKUPS),
            ("rot", ROT, 100_000),
        ] {
            fill(&self.gate_clients, &self.gate, namespace, base, count).await;
        }
        report.add_fill(&filled, rss_empty, rss_filled, &default_stats);
    }

    /// Sanity before anything is timed: added keys answer MAY_EXIST (or every later figure measures a
    /// broken filter), and the false-positive rate of never-added keys, measured through the server,
    /// should be near `FALSE_POSITIVE_RATE`.
    pub(crate) async fn measure_false_positives(&self, report: &mut Report) {
        let requests = lookup_requests("", LOOKUP_BATCH, true);
        let (mut present_hits, mut absent_hits, mut checked) = (0u64, 0u64, 0u64);
        let mut client = self.gate_clients[0].clone();
        for request in requests.iter().take(32) {
            let reply = client
                .batch_may_exist(request.clone())
                .await
                .expect("BatchMayExist")
                .into_inner();
            for i in 0..LOOKUP_BATCH {
                let bit = reply.may_exist_bitmap[i / 8] >> (i % 8) & 1;
                if i % 2 == 0 {
                    present_hits += u64::from(bit);
                } else {
                    absent_hits += u64::from(bit);
                }
            }
            checked += LOOKUP_BATCH as u64 / 2;
        }
        assert_eq!(present_hits, checked, "an added key answered ABSENT");
        report.measured_fp = absent_hits as f64 / checked as f64;
    }

    /// The Redisson-style bitmap the `GETBIT` comparisons probe: sized for the same keys and rate, filled
    /// with random bits (the state of a full filter; GETBIT costs the same whatever the bits are). Its
    /// `used_memory` growth is the Redis side of the filter's memory.
    pub(crate) async fn fill_redis_bloom(&self, report: &mut Report) {
        let Some(connections) = &self.redis_connections else {
            return;
        };
        let before = self.redis_used_memory().await;
        let (bits, probes) = fill_redis_bitmap(&mut connections[0].clone()).await;
        let after = self.redis_used_memory().await;
        report.redis_bloom = Some((bits, probes, after.saturating_sub(before)));
    }

    /// Unary `MayExist`, gate against trivial tonic: server CPU per call (target 3). Nothing has scraped
    /// `/metrics` before it, so the gate's RSS growth over it is what its request histograms buffer when
    /// unscraped; right after, one scrape's cost is measured, and from then on the harness scrapes as a
    /// deployment's Prometheus would. Returns the samples (gate, trivial) and the scraper, which runs to
    /// the end.
    pub(crate) async fn unary_lookups(
        &self,
        report: &mut Report,
    ) -> (Vec<Sample>, Option<JoinHandle<()>>) {
        println!("unary MayExist: gate vs trivial tonic...");
        let unary_keys = Arc::new(keys((0..UNARY_POOL as u64).map(lookup_index)));
        let rss_before_unary = self.gate.rss_bytes();
        let unary = compare(
            &self.gate_and_trivial(|clients| may_exist(clients, "", Arc::clone(&unary_keys), None)),
            STRETCH,
        )
        .await;
        // Nothing has scraped /metrics yet: the request histograms have buffered every call's sample.
        report.unbuffered_growth = Some((
            self.gate.rss_bytes().saturating_sub(rss_before_unary),
            unary[0].calls + unary[0].errors,
        ));
        report.rows.push(
            self.gate_row("MayExist (unary)", &unary[0])
                .per_call_vs(&unary[1], "trivial"),
        );
        self.measure_scrape_cost(report).await;
        // From here on /metrics is scraped, as a deployment's Prometheus does.
        let scraper = self
            .gate
            .http_addr
            .map(|addr| scrape_metrics(addr, SCRAPE_EVERY));
        report
            .rows
            .push(self.trivial_row("MayExist (unary)", &unary[1]));
        (unary, scraper)
    }

    /// The gate's CPU per `/metrics` scrape, the average of a few made while nothing else runs, and the
    /// filter bytes it held then (a scrape that counted filter bits would grow with them).
    pub(crate) async fn measure_scrape_cost(&self, report: &mut Report) {
        const SCRAPES: u32 = 20;
        let Some(http) = self.gate.http_addr else {
            return;
        };
        scrape_once(http).await;
        let before = self.gate.cpu_seconds();
        for _ in 0..SCRAPES {
            scrape_once(http).await;
        }
        let seconds = (self.gate.cpu_seconds() - before) / f64::from(SCRAPES);
        let mut admin = AdminClient::connect(format!("http://{}", self.gate.addr))
            .await
            .expect("the admin service");
        let filter_bytes: u64 = admin
            .stats(StatsRequest {
                namespace: String::new(),
            })
            .await
            .expect("Stats")
            .into_inner()
            .namespaces
            .iter()
            .map(|n| n.filter_bytes)
            .sum();
        report.scrape_cpu = Some((seconds, filter_bytes));
    }

    /// `BatchMayExist` of `LOOKUP_BATCH` keys, as repeated `keys` and as `packed_keys`, gate against trivial
    /// tonic: server CPU per key against the trivial server's packed ceiling (targets 2 and 4a); and Redis
    /// `GETBIT` pipelines probing the same keys the way Redisson's Bloom filter does (target 4b).
    pub(crate) async fn batch_lookups(&self, report: &mut Report) -> BatchLookups {
        println!("BatchMayExist of {LOOKUP_BATCH} keys (repeated bytes, packed) vs trivial tonic and Redis GETBIT...");
        let keyed = lookup_requests("", LOOKUP_BATCH, false);
        let packed = lookup_requests("", LOOKUP_BATCH, true);
        let sides = self
            .gate_and_trivial(|clients| batch_may_exist(clients, Arc::clone(&keyed), LOOKUP_BATCH))
            .into_iter()
            .chain(self.gate_and_trivial(|clients| {
                batch_may_exist(clients, Arc::clone(&packed), LOOKUP_BATCH)
            }))
            .collect();
        let (samples, getbit) = self
            .compare_with_redis(sides, |c| getbit(c, LOOKUP_BATCH), STRETCH)
            .await;
        let [gate_keyed, trivial_keyed, gate_packed, trivial_packed] =
            <[Sample; 4]>::try_from(samples).expect("one sample per side");
        let batch = BatchLookups {
            gate_keyed,
            trivial_keyed,
            gate_packed,
            trivial_packed,
            getbit,
        };
        self.push_batch_rows(report, &batch);
        batch
    }

    /// The batch comparison's rows: the gate and the trivial server in each encoding against the trivial
    /// server's packed ceiling, then Redis against the gate's packed batches.
    pub(crate) fn push_batch_rows(&self, report: &mut Report, batch: &BatchLookups) {
        let ceiling = &batch.trivial_packed;
        let label = format!("BatchMayExist {LOOKUP_BATCH} keys, `keys`");
        report.rows.push(
            self.gate_row(&label, &batch.gate_keyed)
                .per_key_vs(ceiling, "trivial packed"),
        );
        report.rows.push(
            self.trivial_row(&label, &batch.trivial_keyed)
                .per_key_vs(ceiling, "trivial packed"),
        );
        let label = format!("BatchMayExist {LOOKUP_BATCH} keys, `packed_keys`");
        report.rows.push(
            self.gate_row(&label, &batch.gate_packed)
                .per_key_vs(ceiling, "trivial packed"),
        );
        report.rows.push(self.trivial_row(&label, ceiling));
        let (_, probes) = redisson_geometry(FILLED_KEYS, FALSE_POSITIVE_RATE);
        let label = format!("{LOOKUP_BATCH} keys × {probes} GETBIT, pipelined");
        report.rows.extend(
            self.redis_row(&label, batch.getbit.as_ref())
                .map(|row| row.throughput_vs(&batch.gate_packed, "gate packed")),
        );
    }

    /// Packed `BatchMayExist` against Redis `GETBIT` pipelines at each batch size of `SWEEP` (the plot):
    /// where batching stops paying, and how the gap to Redis changes with it. The `LOOKUP_BATCH` point is
    /// the batch comparison's.
    pub(crate) async fn batch_size_sweep(&self, report: &mut Report, batch: &BatchLookups) {
        println!("batch size sweep {SWEEP:?}: gate packed vs Redis GETBIT...");
        for size in SWEEP {
            let (gate_sample, redis_sample) = if size == LOOKUP_BATCH {
                (batch.gate_packed.clone(), batch.getbit.clone())
            } else {
                let gate = self.gate_side(|clients| {
                    batch_may_exist(clients, lookup_requests("", size, true), size)
                });
                let (mut samples, redis_sample) = self
                    .compare_with_redis(vec![gate], |c| getbit(c, size), SWEEP_STRETCH)
                    .await;
                (samples.remove(0), redis_sample)
            };
            report.sweep.push((size, gate_sample, redis_sample));
        }
    }

    /// `RecordAbsent` of a new key per call, gate against trivial tonic (server CPU per call), and what a
    /// cache of misses does instead, Redis `SET key "" NX EX 60`; returns the markers Redis now holds and
    /// its memory growth over them, which the tombstone-store step sets against tombstones'.
    pub(crate) async fn record_absent_writes(&self, report: &mut Report) -> RedisMarkers {
        println!("RecordAbsent vs Redis SET NX EX 60...");
        let used_memory_before = self.redis_used_memory().await;
        let markers = Arc::new(AtomicU64::new(0));
        let sides = self.gate_and_trivial(|clients| {
            record_absent(
                clients,
                "writes",
                WRITES,
                WRITE_CANDIDATES,
                Arc::new(AtomicU64::new(0)),
            )
        });
        let (writes, set) = self
            .compare_with_redis(
                sides.into(),
                |c| redis_set_nx(c, Arc::clone(&markers)),
                STRETCH,
            )
            .await;
        let used_memory_growth = self
            .redis_used_memory()
            .await
            .saturating_sub(used_memory_before);
        let label = "RecordAbsent (unary, new key each)";
        report.rows.push(
            self.gate_row(label, &writes[0])
                .per_call_vs(&writes[1], "trivial"),
        );
        report.rows.push(self.trivial_row(label, &writes[1]));
        report.rows.extend(
            self.redis_row(
                "SET key \"\" NX EX 60 (16 in flight per connection)",
                set.as_ref(),
            )
            .map(|row| row.throughput_vs(&writes[0], "gate RecordAbsent")),
        );
        RedisMarkers {
            set: markers.load(Ordering::Relaxed),
            used_memory_growth,
        }
    }

    /// Unary `MayExist` of keys holding a live tombstone: server CPU per call against the trivial server's
    /// unary lookups (`unary`, of the unary step), and Redis `GET` of the same keys' null markers, the
    /// lookup a cache of misses makes.
    pub(crate) async fn tombstoned_lookups(&self, report: &mut Report, unary: &[Sample]) {
        println!("tombstoned MayExist vs Redis GET of null markers...");
        let tomb_keys = self.record_tombstones_and_markers().await;
        report.tombstone_lookup_keys = tomb_keys.len();
        let gate = self.gate_side(|clients| {
            may_exist(
                clients,
                "tomb",
                Arc::clone(&tomb_keys),
                Some(Basis::Tombstone),
            )
        });
        let (tomb_lookups, get) = self
            .compare_with_redis(
                vec![gate],
                |c| redis_get(c, Arc::clone(&tomb_keys)),
                STRETCH,
            )
            .await;
        report.rows.push(
            self.gate_row("MayExist of tombstoned keys (unary)", &tomb_lookups[0])
                .per_call_vs(&unary[1], "trivial"),
        );
        report.rows.extend(
            self.redis_row(
                "GET null marker (16 in flight per connection)",
                get.as_ref(),
            )
            .map(|row| row.throughput_vs(&tomb_lookups[0], "gate tombstone MayExist")),
        );
    }

    /// Records a tombstone in `tomb` for each of `TOMBSTONE_LOOKUPS` keys and sets the same keys' null
    /// markers in Redis, so that every lookup of the tombstoned-lookup step finds one; returns the keys.
    pub(crate) async fn record_tombstones_and_markers(&self) -> Arc<Vec<Bytes>> {
        repeat(
            &record_absent(
                &self.gate_clients,
                "tomb",
                TOMB,
                TOMBSTONE_LOOKUPS,
                Arc::new(AtomicU64::new(0)),
            ),
            TOMBSTONE_LOOKUPS,
            "RecordAbsent into `tomb`",
        )
        .await;
        let tomb_keys = Arc::new(keys((0..TOMBSTONE_LOOKUPS).map(|i| TOMB + i)));
        if let Some(connections) = &self.redis_connections {
            let mut connection = connections[0].clone();
            let mut pipeline = redis::pipe();
            for key in tomb_keys.iter() {
                pipeline
                    .cmd("SET")
                    .arg(&key[..])
                    .arg("")
                    .arg("EX")
                    .arg(600)
                    .ignore();
            }
            let () = pipeline
                .query_async(&mut connection)
                .await
                .expect("SET markers");
        }
        tomb_keys
    }

    /// Tail latency of unary `MayExist` in `rot`, offered open loop at half the gate's capacity while Adds
    /// run and a window rotation passes (target 5: the rotation must not stall readers), and the trivial
    /// server at the same rate for the floor of the stack on this machine.
    pub(crate) async fn tail_latency(&self, report: &mut Report) {
        let rot_keys = Arc::new(keys((0..UNARY_POOL as u64).map(|j| {
            if j & 1 == 0 {
                ROT + j / 2
            } else {
                ABSENT + j
            }
        })));
        let lookups = may_exist(&self.gate_clients, "rot", Arc::clone(&rot_keys), None);
        let capacity = self.capacity(&lookups).await;
        let rate = capacity / 2.0;
        let now = unix_ms();
        let boundary = (now + 3_000).div_ceil(ROTATION_SPAN_MS) * ROTATION_SPAN_MS;
        let duration = Duration::from_millis(boundary + 5_000 - now);
        println!(
            "tail latency: MayExist at {rate:.0}/s (half of {capacity:.0}/s) for {:.1} s with Adds; rotation at +{:.1} s...",
            duration.as_secs_f64(),
            (boundary - now) as f64 / 1e3
        );
        let adder = add_to_rot_for(&self.gate_clients, duration);
        let (mut tail, timed) =
            drive::open_loop(rate, CONNECTIONS, duration, self.gate.pid(), &lookups).await;
        tail.sort();
        let add_latencies = adder.await.expect("the Add task panicked");
        let rot_stats = stats(&self.gate, "rot").await;
        let trivial = self.trivial_tail(rate, rot_keys).await;
        report.tail = Some(report::Tail {
            rate,
            capacity,
            rotation_at: (boundary - now) as f64 / 1e3,
            sample: tail,
            timed,
            adds: add_latencies,
            add_keys: ROTATION_ADD_KEYS,
            add_every: ADD_EVERY,
            trivial,
            windows: rot_stats.windows,
        });
    }

    /// The gate's closed-loop calls/s of `lookups`, measured right before the tail-latency run: the
    /// machine's other load changes over minutes.
    pub(crate) async fn capacity(&self, lookups: &Op) -> f64 {
        let pid = self.gate.pid();
        drive::closed_loop(CONNECTIONS, IN_FLIGHT, WARM_UP, pid, lookups).await;
        drive::closed_loop(CONNECTIONS, IN_FLIGHT, Duration::from_secs(2), pid, lookups)
            .await
            .calls_per_second()
    }

    /// The trivial server's latencies at the tail-latency run's `rate` (sorted).
    pub(crate) async fn trivial_tail(&self, rate: f64, rot_keys: Arc<Vec<Bytes>>) -> Sample {
        println!("tail latency: trivial tonic at the same rate...");
        let lookups = may_exist(&self.trivial_clients, "rot", rot_keys, None);
        let (mut tail, _) = drive::open_loop(
            rate,
            CONNECTIONS,
            Duration::from_secs(6),
            self.trivial.pid(),
            &lookups,
        )
        .await;
        tail.sort();
        tail
    }
}

// What the steps share: sides of comparisons, rows, Redis' memory.
impl Bench {
    /// The gate, driven by `op` on its connections.
    pub(crate) fn gate_side(&self, op: impl FnOnce(&Clients) -> Op) -> Side<'_> {
        Side {
            server: &self.gate,
            op: op(&self.gate_clients),
        }
    }

    /// The gate's and the trivial server's sides of a comparison, each driven by `op` on its connections.
    pub(crate) fn gate_and_trivial(&self, op: impl Fn(&Clients) -> Op) -> [Side<'_>; 2] {
        [
            self.gate_side(&op),
            Side {
                server: &self.trivial,
                op: op(&self.trivial_clients),
            },
        ]
    }

    /// Measures `sides` and, if Redis runs, Redis driven by `redis_op`, in alternating stretches; returns
    /// the samples of `sides` in order, and Redis' apart.
    pub(crate) async fn compare_with_redis<'a>(
        &'a self,
        mut sides: Vec<Side<'a>>,
        redis_op: impl FnOnce(&RedisConnections) -> Op,
        stretch: Duration,
    ) -> (Vec<Sample>, Option<Sample>) {
        let redis_index = sides.len();
        if let (Some(redis), Some(connections)) = (&self.redis, &self.redis_connections) {
            sides.push(Side {
                server: redis,
                op: redis_op(connections),
            });
        }
        let mut samples = compare(&sides, stretch).await;
        drop(sides);
        let redis = (samples.len() > redis_index).then(|| samples.remove(redis_index));
        (samples, redis)
    }

    /// A row of the gate's `sample`, with the gate's RSS now.
    pub(crate) fn gate_row(&self, workload: &str, sample: &Sample) -> Row {
        Row::new(workload, "gate", sample, self.gate.rss_bytes())
    }

    /// A row of the trivial server's `sample`, with its RSS now.
    pub(crate) fn trivial_row(&self, workload: &str, sample: &Sample) -> Row {
        Row::new(workload, "trivial tonic", sample, self.trivial.rss_bytes())
    }

    /// A row of Redis' `sample`, with its RSS now; `None` if Redis did not run.
    pub(crate) fn redis_row(&self, workload: &str, sample: Option<&Sample>) -> Option<Row> {
        let (sample, redis) = (sample?, self.redis.as_ref()?);
        Some(Row::new(workload, "redis", sample, redis.rss_bytes()))
    }

    /// Redis' `used_memory` (0 without Redis).
    pub(crate) async fn redis_used_memory(&self) -> u64 {
        let Some(connections) = &self.redis_connections else {
            return 0;
        };
        let mut connection = connections[0].clone();
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut connection)
            .await
            .expect("INFO memory");
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// One Add of `ROTATION_ADD_KEYS` new keys to `rot` every `ADD_EVERY` for `duration`: the writes beside the
/// tail-latency lookups (the first Add after the window boundary builds the new window). The task returns
/// the Adds' latencies, sorted.
pub(crate) fn add_to_rot_for(clients: &Clients, duration: Duration) -> JoinHandle<Vec<u64>> {
    let clients = Arc::clone(clients);
    let deadline = Instant::now() + duration;
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(ADD_EVERY);
        let mut client = clients[0].clone();
        let (mut next, mut latencies) = (1_000_000u64, Vec::new());
        while Instant::now() < deadline {
            ticks.tick().await;
            let request = AddRequest {
                namespace: "rot".to_string(),
                keys: keys((next..next + ROTATION_ADD_KEYS).map(|i| ROT + i)),
                ..Default::default()
            };
            let sent = Instant::now();
            client
                .add(request)
                .await
                .expect("Add during the latency run");
            latencies.push(sent.elapsed().as_nanos() as u64);
            next += ROTATION_ADD_KEYS;
        }
        latencies.sort_unstable();
        latencies
    })
}
