package statestore.interop;

import java.time.Duration;
import java.util.List;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyDescription;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.ReadOnlyWindowStore;
import org.apache.kafka.streams.state.WindowStore;

/**
 * More window-store topologies for {@link StreamsApp} ({@code --stores more-windows}), kept apart from it.
 *
 * <p>One application over the input topic {@code <app>-input}, written against the API of Kafka Streams 3.9 to
 * 4.4:
 * <ul>
 * <li>a hopping-window count, {@code hcounts}: 1-minute windows advancing by 20 s, no grace (a timestamped window
 * store, retention 60 s, segment interval 60 s);</li>
 * <li>a stream-stream inner join of the input with its own values cut to 3 characters, {@code JoinWindows} of 60 s
 * before and after, no grace: the join window stores {@code jn-this-join-store} and {@code jn-other-join-store}
 * (retention 120 s, with duplicates, {@code retainDuplicates}); the join results are counted per key in
 * {@code jcounts} (a timestamped key-value store);</li>
 * <li>a {@code groupBy} of the key's first 6 characters (groups of 10 keys) and {@code count()}: a repartition
 * topic, and the count's store in sub-topology 1 under the name the DSL generates
 * ({@code KSTREAM-AGGREGATE-STATE-STORE-...}).</li>
 * </ul>
 * A run is done once every input record reached every store: {@code processed} counts the input and the grouped
 * counts sum to it.
 */
final class WindowTopologies {
    static final String MORE_WINDOWS = "more-windows";
    static final String HCOUNTS = "hcounts";
    static final String JOIN = "jn";
    static final String JCOUNTS = "jcounts";
    static final String GROUPED_PREFIX = "KSTREAM-AGGREGATE-STATE-STORE-";
    static final Duration HOP_SIZE = Duration.ofMinutes(1);
    static final Duration HOP_ADVANCE = Duration.ofSeconds(20);
    static final Duration JOIN_DIFFERENCE = Duration.ofSeconds(60);

    private WindowTopologies() {}

    /** The {@code --stores} choices built here. */
    static List<String> choices() {
        return List.of(MORE_WINDOWS);
    }

    /** The stores a run summarizes (the grouped count's name is the DSL's; see {@link #groupedStore}). */
    static List<String> storeNames(Topology topology) {
        return List.of(HCOUNTS, JCOUNTS, groupedStore(topology));
    }

    /** How many stores (so changelogs per partition) the topology has (a join's stores are named twice). */
    static int changelogs(Topology topology) {
        java.util.Set<String> stores = new java.util.HashSet<>();
        for (TopologyDescription.Subtopology sub : topology.describe().subtopologies()) {
            for (TopologyDescription.Node node : sub.nodes()) {
                if (node instanceof TopologyDescription.Processor p) {
                    stores.addAll(p.stores());
                }
            }
        }
        return stores.size();
    }

    /** The store the DSL named for the grouped count, from the topology's description. */
    static String groupedStore(Topology topology) {
        for (TopologyDescription.Subtopology sub : topology.describe().subtopologies()) {
            for (TopologyDescription.Node node : sub.nodes()) {
                if (node instanceof TopologyDescription.Processor p) {
                    for (String store : p.stores()) {
                        if (store.startsWith(GROUPED_PREFIX)) {
                            return store;
                        }
                    }
                }
            }
        }
        throw new IllegalStateException("no grouped count in the topology");
    }

    static Topology build(String input, AtomicLong processed) {
        StreamsBuilder b = new StreamsBuilder();
        KStream<String, String> in = b.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .peek((k, v) -> processed.incrementAndGet());
        in.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                .windowedBy(TimeWindows.ofSizeWithNoGrace(HOP_SIZE).advanceBy(HOP_ADVANCE))
                .count(Materialized.<String, Long, WindowStore<Bytes, byte[]>>as(HCOUNTS)
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()));
        KStream<String, String> cut = in.mapValues(v -> v.substring(0, Math.min(3, v.length())));
        in.join(cut, (left, right) -> left + "|" + right, JoinWindows.ofTimeDifferenceWithNoGrace(JOIN_DIFFERENCE),
                        StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String()).withStoreName(JOIN))
                .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as(JCOUNTS)
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()));
        in.groupBy((k, v) -> k.substring(0, Math.min(6, k.length())), Grouped.with(Serdes.String(), Serdes.String()))
                .count();
        return b.build();
    }

    /**
     * Whether every input record reached every store: {@code expected} processed by this run, and all {@code total}
     * records of the input counted once grouped (a restarted run's grouped counts hold the earlier input too).
     */
    static boolean done(KafkaStreams streams, Topology topology, long expected, long total, long processed) {
        if (processed < expected) {
            return false;
        }
        try {
            ReadOnlyKeyValueStore<String, Long> grouped = streams.store(StoreQueryParameters.fromNameAndType(
                    groupedStore(topology), QueryableStoreTypes.<String, Long>keyValueStore()));
            long sum = 0;
            try (KeyValueIterator<String, Long> it = grouped.all()) {
                while (it.hasNext()) {
                    sum += it.next().value;
                }
            }
            return sum == total;
        } catch (InvalidStateStoreException e) {
            return false;
        }
    }

    /** The summary line of store {@code name} (the hopping windows: entries {@code key@windowStart}). */
    static String summarize(KafkaStreams streams, String name, boolean print) throws Exception {
        if (!name.equals(HCOUNTS)) {
            return StreamsApp.summarize(streams, name, print);
        }
        ReadOnlyWindowStore<String, Long> store = streams.store(
                StoreQueryParameters.fromNameAndType(HCOUNTS, QueryableStoreTypes.<String, Long>windowStore()));
        TreeMap<String, Long> all = new TreeMap<>();
        try (KeyValueIterator<Windowed<String>, Long> it = store.all()) {
            while (it.hasNext()) {
                KeyValue<Windowed<String>, Long> kv = it.next();
                all.put(kv.key.key() + "@" + kv.key.window().start(), kv.value);
            }
        }
        return StreamsApp.digest(HCOUNTS, all, print);
    }
}
