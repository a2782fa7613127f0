package statestore.interop;

import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.ReadOnlySessionStore;
import org.apache.kafka.streams.state.ReadOnlyWindowStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.Stores;

/**
 * A small Kafka Streams application whose state statestore reads and writes.
 *
 * <p>One subtopology over the input topic {@code <app>-input}: a Processor API node that keeps the latest value per
 * key in a plain persistent store ({@code latest}, {@code Stores.persistentKeyValueStore}: column families
 * {@code default} + {@code offsets}), and a DSL {@code groupByKey().count()} materialized as {@code counts} (the
 * default timestamped store: {@code keyValueWithTimestamp} + {@code offsets}). Task directories are {@code 0_<p>}.
 *
 * <p>{@code --stores latest} or {@code counts} builds the topology with that store alone (the benchmark).
 * {@code --stores windowed} builds instead a tumbling windowed count ({@code wcounts}: 1-minute windows, no grace,
 * a timestamped window store of retention 60 s) and a session-windowed count ({@code scounts}: 30 s inactivity
 * gap, no grace, a session store of retention 30 s); both segment by the DSL's interval, 60 s. {@code --stores wcounts}
 * builds the tumbling windowed count alone, its retention {@code --retention-ms R} if given (the DSL's segment
 * interval is then {@code max(R / 2, 60 s)}): the windowed benchmark. With
 * {@code --time-step-ms S} input record {@code seq} gets the timestamp {@code F + seq * S} ({@code F}:
 * {@code --first-timestamp-ms}, default 1700000000000; a recent one keeps the broker's retention from deleting
 * the input and changelogs), so windows open, close and expire as the input goes. {@code --input-topic T} reads T instead of
 * {@code <app>-input} (a second application over the same input); a windowed run is done once it processed
 * {@code --expect N} records (default: those it produced). {@code --stores versioned} builds instead the topology
 * of {@link VersionedTopology}: versioned key-value stores (Processor API, and a DSL table) fed out-of-order
 * timestamps and tombstones.
 *
 * <p>{@code --stores more-windows} builds {@link WindowTopologies}' application instead: a hopping-window count, a
 * stream-stream join whose results are counted, and a {@code groupBy} count in sub-topology 1. {@code --stores headers}
 * builds the topology of {@link HeadersTopologies} (header-aware stores, Kafka Streams 4.3+) and {@code emit-final}
 * that of {@link EmitFinalTopology} (emit-final windows and sessions), done as a windowed run is.
 *
 * <p>Modes: {@code process} (optionally produce {@code --produce N} input records first, then run until every input
 * record is counted, print the results and close) and {@code restore} (start, wait until every store is restored,
 * close). Both print one line per event, space separated, for tests to parse:
 * <pre>
 * RESTORE_START topic partition store from to nanos
 * RESTORE_END topic partition store restored nanos
 * RESTORE_SUMMARY changelogs=N restored=R first_start_nanos=.. last_end_nanos=.. ms=.. cpu_ms=..
 * PROGRESS processed=N
 * RESULT store key value          (with --print-results)
 * STORE store entries=N sum=S sha256=HEX
 * CLOSED clean=true|false
 * </pre>
 */
public final class StreamsApp {
    /** CPU time of the whole JVM so far, nanoseconds. */
    static long processCpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
                .getProcessCpuTime();
    }

    static final String LATEST = "latest";
    static final String COUNTS = "counts";
    static final String WINDOWED = "windowed";
    static final String VERSIONED = "versioned";
    static final String WCOUNTS = "wcounts";
    static final String SCOUNTS = "scounts";
    static final Duration WINDOW_SIZE = Duration.ofMinutes(1);
    static final Duration SESSION_GAP = Duration.ofSeconds(30);
    static final long FIRST_TIMESTAMP = 1_700_000_000_000L;

    private StreamsApp() {}

    /** Command-line settings. */
    static final class Args {
        String bootstrap;
        String appId;
        String stateDir;
        String guarantee = "at_least_once";
        String mode = "process";
        long produce = 0;
        int keys = 1000;
        int valueSize = 100;
        int partitions = 4;
        int threads = 1;
        long timeoutSeconds = 600;
        boolean printResults = false;
        /** Which stores the topology has: both, latest (plain only) or counts (timestamped only). */
        String stores = "both";
        /** Input record timestamps: FIRST_TIMESTAMP + seq * timeStepMs (0: the producer's clock). */
        long timeStepMs = 0;
        long firstTimestamp = FIRST_TIMESTAMP;
        /** Windowed: input records this run processes before it is done (-1: those it produces). */
        long expect = -1;
        /** Retention of the windowed count, ms (0: the DSL's, window size + grace). */
        long retentionMs = 0;
        String inputTopic;
        final Map<String, String> config = new TreeMap<>();

        static Args parse(String[] argv) {
            Args a = new Args();
            for (int i = 0; i < argv.length; i++) {
                String flag = argv[i];
                if (flag.equals("--print-results")) {
                    a.printResults = true;
                    continue;
                }
                if (i + 1 >= argv.length) {
                    throw new IllegalArgumentException("flag " + flag + " needs a value");
                }
                String v = argv[++i];
                switch (flag) {
                    case "--bootstrap" -> a.bootstrap = v;
                    case "--application-id" -> a.appId = v;
                    case "--state-dir" -> a.stateDir = v;
                    case "--guarantee" -> a.guarantee = v;
                    case "--mode" -> a.mode = v;
                    case "--produce" -> a.produce = Long.parseLong(v);
                    case "--keys" -> a.keys = Integer.parseInt(v);
                    case "--value-size" -> a.valueSize = Integer.parseInt(v);
                    case "--partitions" -> a.partitions = Integer.parseInt(v);
                    case "--threads" -> a.threads = Integer.parseInt(v);
                    case "--timeout" -> a.timeoutSeconds = Long.parseLong(v);
                    case "--stores" -> a.stores = v;
                    case "--time-step-ms" -> a.timeStepMs = Long.parseLong(v);
                    case "--first-timestamp-ms" -> a.firstTimestamp = Long.parseLong(v);
                    case "--input-topic" -> a.inputTopic = v;
                    case "--expect" -> a.expect = Long.parseLong(v);
                    case "--retention-ms" -> a.retentionMs = Long.parseLong(v);
                    case "--config" -> {
                        int eq = v.indexOf('=');
                        if (eq <= 0) {
                            throw new IllegalArgumentException("--config takes key=value, got " + v);
                        }
                        a.config.put(v.substring(0, eq), v.substring(eq + 1));
                    }
                    default -> throw new IllegalArgumentException("unknown flag " + flag);
                }
            }
            if (a.bootstrap == null || a.appId == null || a.stateDir == null) {
                throw new IllegalArgumentException("--bootstrap, --application-id and --state-dir are required");
            }
            if (!List.of("both", LATEST, COUNTS, WINDOWED, WCOUNTS, VERSIONED).contains(a.stores)
                    && !WindowTopologies.choices().contains(a.stores) && !a.stores.equals(HeadersChoices.HEADERS)
                    && !a.stores.equals(EmitFinalTopology.NAME)) {
                throw new IllegalArgumentException("--stores is both, latest, counts, windowed, wcounts, versioned, "
                        + "headers, emit-final or one of " + WindowTopologies.choices() + ", got " + a.stores);
            }
            if (!a.mode.equals("process") && !a.mode.equals("restore")) {
                throw new IllegalArgumentException("--mode is process or restore, got " + a.mode);
            }
            return a;
        }

        /** Whether the topology is windowed (done once {@code --expect} records are processed). */
        boolean windowed() {
            return stores.equals(WINDOWED) || stores.equals(WCOUNTS);
        }

        String inputTopic() {
            return inputTopic != null ? inputTopic : appId + "-input";
        }

        /** The stores of the topology. */
        List<String> storeNames() {
            return switch (stores) {
                case HeadersChoices.HEADERS -> HeadersChoices.STORES;
                case EmitFinalTopology.NAME -> EmitFinalTopology.STORES;
                case LATEST -> List.of(LATEST);
                case COUNTS -> List.of(COUNTS);
                case WINDOWED -> List.of(WCOUNTS, SCOUNTS);
                case WCOUNTS -> List.of(WCOUNTS);
                case VERSIONED -> VersionedTopology.STORES;
                default -> List.of(LATEST, COUNTS);
            };
        }
    }

    static void out(String line) {
        synchronized (System.out) {
            System.out.println(line);
            System.out.flush();
        }
    }

    /** Keeps the latest value of every key in the plain store and counts what this run processed. */
    static final class LatestProcessor implements Processor<String, String, Void, Void> {
        private final AtomicLong processed;
        private KeyValueStore<String, String> store;

        LatestProcessor(AtomicLong processed) {
            this.processed = processed;
        }

        @Override
        public void init(ProcessorContext<Void, Void> context) {
            store = context.getStateStore(LATEST);
        }

        @Override
        public void process(Record<String, String> record) {
            store.put(record.key(), record.value());
            processed.incrementAndGet();
        }
    }

    static Topology topology(String input, String stores, long retentionMs, AtomicLong processed) throws Exception {
        if (WindowTopologies.choices().contains(stores)) {
            return WindowTopologies.build(input, processed);
        }
        if (stores.equals(VERSIONED)) {
            return VersionedTopology.topology(input, processed);
        }
        if (stores.equals(HeadersChoices.HEADERS)) {
            return HeadersChoices.topology(input, processed);
        }
        if (stores.equals(EmitFinalTopology.NAME)) {
            return EmitFinalTopology.topology(input, processed);
        }
        StreamsBuilder b = new StreamsBuilder();
        KStream<String, String> in = b.stream(input, Consumed.with(Serdes.String(), Serdes.String()));
        if (stores.equals(WINDOWED) || stores.equals(WCOUNTS)) {
            KStream<String, String> counted = in.peek((k, v) -> processed.incrementAndGet());
            Materialized<String, Long, WindowStore<Bytes, byte[]>> wstore =
                    Materialized.<String, Long, WindowStore<Bytes, byte[]>>as(WCOUNTS)
                            .withKeySerde(Serdes.String())
                            .withValueSerde(Serdes.Long());
            counted.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                    .windowedBy(TimeWindows.ofSizeWithNoGrace(WINDOW_SIZE))
                    .count(retentionMs > 0 ? wstore.withRetention(Duration.ofMillis(retentionMs)) : wstore);
            if (stores.equals(WCOUNTS)) {
                return b.build();
            }
            counted.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                    .windowedBy(SessionWindows.ofInactivityGapWithNoGrace(SESSION_GAP))
                    .count(Materialized.<String, Long, SessionStore<Bytes, byte[]>>as(SCOUNTS)
                            .withKeySerde(Serdes.String())
                            .withValueSerde(Serdes.Long()));
            return b.build();
        }
        if (!stores.equals(COUNTS)) {
            b.addStateStore(Stores.keyValueStoreBuilder(
                    Stores.persistentKeyValueStore(LATEST), Serdes.String(), Serdes.String()));
            in.process(() -> new LatestProcessor(processed), LATEST);
        }
        if (!stores.equals(LATEST)) {
            in.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                    .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as(COUNTS)
                            .withKeySerde(Serdes.String())
                            .withValueSerde(Serdes.Long()));
        }
        return b.build();
    }

    static void ensureTopic(Admin admin, String topic, int partitions) throws Exception {
        try {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
        } catch (java.util.concurrent.ExecutionException e) {
            if (!(e.getCause() instanceof TopicExistsException)) {
                throw e;
            }
        }
    }

    /** Records in the input topic (its producer is not transactional, so the end offsets sum to the count). */
    static long inputRecords(Admin admin, String topic, int partitions) throws Exception {
        Map<TopicPartition, OffsetSpec> req = new TreeMap<>((x, y) -> Integer.compare(x.partition(), y.partition()));
        for (int p = 0; p < partitions; p++) {
            req.put(new TopicPartition(topic, p), OffsetSpec.latest());
        }
        long total = 0;
        for (ListOffsetsResult.ListOffsetsResultInfo info : admin.listOffsets(req).all().get().values()) {
            total += info.offset();
        }
        return total;
    }

    static void produce(Args a, long firstSeq) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, a.bootstrap);
        p.put(ProducerConfig.LINGER_MS_CONFIG, "20");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "262144");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        try (KafkaProducer<String, String> prod =
                new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            for (long i = 0; i < a.produce; i++) {
                long seq = firstSeq + i;
                String key = String.format("k%06d", seq % a.keys);
                StringBuilder v = new StringBuilder("v").append(seq).append('-');
                while (v.length() < a.valueSize) {
                    v.append('x');
                }
                Long ts = a.timeStepMs > 0 ? a.firstTimestamp + seq * a.timeStepMs : null;
                ProducerRecord<String, String> rec = new ProducerRecord<>(a.inputTopic(), null, ts, key, v.toString());
                if (a.stores.equals(HeadersChoices.HEADERS)) {
                    HeadersChoices.addHeaders(rec.headers(), seq);
                }
                prod.send(rec);
            }
            prod.flush();
        }
        out("PRODUCED records=" + a.produce);
    }

    /** Entries, sum of values (counts store) and a digest of the sorted store, through interactive queries. */
    static <V> String summarize(KafkaStreams streams, String name, boolean print) throws Exception {
        ReadOnlyKeyValueStore<String, V> store = streams.store(
                StoreQueryParameters.fromNameAndType(name, QueryableStoreTypes.<String, V>keyValueStore()));
        TreeMap<String, V> all = new TreeMap<>();
        try (KeyValueIterator<String, V> it = store.all()) {
            while (it.hasNext()) {
                KeyValue<String, V> kv = it.next();
                all.put(kv.key, kv.value);
            }
        }
        return digest(name, all, print);
    }

    /** {@link #summarize} of a windowed count {@code name}: entries {@code key@windowStart}. */
    static String summarizeWindows(KafkaStreams streams, String name, boolean print) throws Exception {
        ReadOnlyWindowStore<String, Long> store = streams.store(
                StoreQueryParameters.fromNameAndType(name, QueryableStoreTypes.<String, Long>windowStore()));
        TreeMap<String, Long> all = new TreeMap<>();
        try (KeyValueIterator<Windowed<String>, Long> it = store.all()) {
            while (it.hasNext()) {
                KeyValue<Windowed<String>, Long> kv = it.next();
                all.put(kv.key.key() + "@" + kv.key.window().start(), kv.value);
            }
        }
        return digest(name, all, print);
    }

    /** {@link #summarize} of the session count, key by key: entries {@code key@start-end}. */
    static String summarizeSessions(KafkaStreams streams, int keys, boolean print) throws Exception {
        ReadOnlySessionStore<String, Long> store = streams.store(
                StoreQueryParameters.fromNameAndType(SCOUNTS, QueryableStoreTypes.<String, Long>sessionStore()));
        TreeMap<String, Long> all = new TreeMap<>();
        for (int k = 0; k < keys; k++) {
            try (KeyValueIterator<Windowed<String>, Long> it = store.fetch(String.format("k%06d", k))) {
                while (it.hasNext()) {
                    KeyValue<Windowed<String>, Long> kv = it.next();
                    all.put(kv.key.key() + "@" + kv.key.window().start() + "-" + kv.key.window().end(), kv.value);
                }
            }
        }
        return digest(SCOUNTS, all, print);
    }

    static <V> String digest(String name, TreeMap<String, V> all, boolean print) throws Exception {
        MessageDigest md = MessageDigest.getInstance("SHA-256");
        long sum = 0;
        for (Map.Entry<String, V> e : all.entrySet()) {
            md.update((e.getKey() + "=" + e.getValue() + "\n").getBytes(StandardCharsets.UTF_8));
            if (e.getValue() instanceof Long l) {
                sum += l;
            }
            if (print) {
                out("RESULT " + name + " " + e.getKey() + " " + e.getValue());
            }
        }
        return "STORE " + name + " entries=" + all.size() + " sum=" + sum + " sha256="
                + HexFormat.of().formatHex(md.digest());
    }

    static long countsSum(KafkaStreams streams) {
        try {
            ReadOnlyKeyValueStore<String, Long> store = streams.store(
                    StoreQueryParameters.fromNameAndType(COUNTS, QueryableStoreTypes.<String, Long>keyValueStore()));
            long sum = 0;
            try (KeyValueIterator<String, Long> it = store.all()) {
                while (it.hasNext()) {
                    sum += it.next().value;
                }
            }
            return sum;
        } catch (InvalidStateStoreException e) {
            return -1;
        }
    }

    public static void main(String[] argv) throws Exception {
        Args a = Args.parse(argv);
        Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, a.bootstrap);
        long total;
        try (Admin admin = Admin.create(ap)) {
            ensureTopic(admin, a.inputTopic(), a.partitions);
            long before = inputRecords(admin, a.inputTopic(), a.partitions);
            if (a.produce > 0 && a.stores.equals(VERSIONED)) {
                VersionedTopology.produce(a, before);
            } else if (a.produce > 0) {
                produce(a, before);
            }
            total = inputRecords(admin, a.inputTopic(), a.partitions);
        }

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, a.appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a.bootstrap);
        p.put(StreamsConfig.STATE_DIR_CONFIG, a.stateDir);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, a.guarantee);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.toString(a.threads));
        p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        p.putAll(a.config);

        AtomicLong processed = new AtomicLong();
        Topology topology = topology(a.inputTopic(), a.stores, a.retentionMs, processed);
        System.err.println(topology.describe());
        KafkaStreams streams = new KafkaStreams(topology, p);

        Map<String, Long> starts = new ConcurrentHashMap<>();
        AtomicInteger started = new AtomicInteger();
        AtomicInteger ended = new AtomicInteger();
        AtomicLong restored = new AtomicLong();
        AtomicLong firstStart = new AtomicLong(Long.MAX_VALUE);
        AtomicLong lastEnd = new AtomicLong(Long.MIN_VALUE);
        // The JVM's CPU time (every thread: restoration, RocksDB, the clients, GC and JIT) at the first start
        // and at the latest end, for the CPU the restoration cost beside its wall time.
        AtomicLong firstStartCpu = new AtomicLong(-1);
        AtomicLong lastEndCpu = new AtomicLong(-1);
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition tp, String store, long from, long to) {
                long now = System.nanoTime();
                firstStartCpu.compareAndSet(-1, processCpuNanos());
                firstStart.accumulateAndGet(now, Math::min);
                starts.put(tp + "/" + store, now);
                started.incrementAndGet();
                out("RESTORE_START " + tp.topic() + " " + tp.partition() + " " + store + " " + from + " " + to + " "
                        + now);
            }

            @Override
            public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long n) {}

            @Override
            public void onRestoreEnd(TopicPartition tp, String store, long total) {
                long now = System.nanoTime();
                lastEndCpu.accumulateAndGet(processCpuNanos(), Math::max);
                lastEnd.accumulateAndGet(now, Math::max);
                restored.addAndGet(total);
                ended.incrementAndGet();
                out("RESTORE_END " + tp.topic() + " " + tp.partition() + " " + store + " " + total + " " + now);
            }

            @Override
            public void onRestoreSuspended(TopicPartition tp, String store, long total) {
                out("RESTORE_SUSPENDED " + tp.topic() + " " + tp.partition() + " " + store + " " + total);
            }
        });
        AtomicReference<KafkaStreams.State> state = new AtomicReference<>(KafkaStreams.State.CREATED);
        streams.setStateListener((now, old) -> {
            state.set(now);
            out("STATE " + now);
        });
        AtomicReference<Throwable> failure = new AtomicReference<>();
        streams.setUncaughtExceptionHandler(e -> {
            failure.set(e);
            e.printStackTrace();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
                    .SHUTDOWN_CLIENT;
        });

        streams.start();
        long deadline = System.nanoTime() + a.timeoutSeconds * 1_000_000_000L;
        boolean more = WindowTopologies.choices().contains(a.stores);
        List<String> storeNames = more ? WindowTopologies.storeNames(topology) : a.storeNames();
        int expectedChangelogs = (more ? WindowTopologies.changelogs(topology) : storeNames.size()) * a.partitions;
        boolean done = false;
        long lastProgress = 0;
        long quietSince = -1;
        while (System.nanoTime() < deadline && failure.get() == null) {
            KafkaStreams.State s = state.get();
            if (s == KafkaStreams.State.ERROR || s == KafkaStreams.State.NOT_RUNNING) {
                break;
            }
            boolean running = s == KafkaStreams.State.RUNNING;
            boolean restoring = started.get() != ended.get();
            if (a.mode.equals("restore")) {
                // Every changelog partition reports a start (an up-to-date one too) and an end.
                if (running && !restoring && ended.get() >= expectedChangelogs) {
                    done = true;
                    break;
                }
                if (running && !restoring) {
                    quietSince = quietSince < 0 ? System.nanoTime() : quietSince;
                    if (System.nanoTime() - quietSince > 5_000_000_000L) {
                        done = true; // up-to-date stores may report no restore at all
                        break;
                    }
                } else {
                    quietSince = -1;
                }
            } else if (running && !restoring
                    && (more ? WindowTopologies.done(streams, topology, a.expect >= 0 ? a.expect : a.produce,
                            total, processed.get())
                    : a.stores.equals(LATEST) ? processed.get() >= a.produce
                    : a.windowed() || a.stores.equals(VERSIONED) || a.stores.equals(HeadersChoices.HEADERS)
                            || a.stores.equals(EmitFinalTopology.NAME)
                            ? processed.get() >= (a.expect >= 0 ? a.expect : a.produce)
                    : countsSum(streams) == total)) {
                done = true;
                break;
            }
            if (processed.get() != lastProgress) {
                lastProgress = processed.get();
                out("PROGRESS processed=" + lastProgress);
            }
            Thread.sleep(200);
        }
        out("PROGRESS processed=" + processed.get());
        if (ended.get() > 0) {
            out("RESTORE_SUMMARY changelogs=" + ended.get() + " restored=" + restored.get()
                    + " first_start_nanos=" + firstStart.get() + " last_end_nanos=" + lastEnd.get()
                    + " ms=" + String.format("%.3f", (lastEnd.get() - firstStart.get()) / 1e6)
                    + " cpu_ms=" + String.format("%.3f", (lastEndCpu.get() - firstStartCpu.get()) / 1e6));
        } else {
            out("RESTORE_SUMMARY changelogs=0 restored=0 ms=0");
        }
        if (done && a.mode.equals("process")) {
            for (String name : storeNames) {
                out(more ? WindowTopologies.summarize(streams, name, a.printResults)
                        : HeadersChoices.isOwnStore(name) ? HeadersChoices.summarize(streams, name, a.keys, a.printResults)
                        : switch (name) {
                    case WCOUNTS, EmitFinalTopology.SWCOUNTS -> summarizeWindows(streams, name, a.printResults);
                    case SCOUNTS -> summarizeSessions(streams, a.keys, a.printResults);
                    case VersionedTopology.STORE, VersionedTopology.DSL_STORE -> VersionedTopology.summarize(
                            streams, name, a.keys, a.firstTimestamp + (total - 1) * a.timeStepMs, a.printResults);
                    default -> summarize(streams, name, a.printResults);
                });
            }
        }
        boolean clean = streams.close(Duration.ofSeconds(120));
        out("CLOSED clean=" + clean);
        if (!done) {
            System.err.println("StreamsApp: did not finish (state " + state.get() + ", failure " + failure.get()
                    + ", processed " + processed.get() + " of " + total + ")");
            System.exit(1);
        }
        System.exit(0);
    }
}
