package statestore.interop;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.common.header.Headers;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.Topology;

/**
 * What {@link StreamsApp} knows of the topology of {@link HeadersTopologies} ({@code --stores headers}): its name,
 * stores and input headers, in APIs every Kafka Streams version has.
 * {@code HeadersTopologies} itself uses Kafka Streams 4.3+ APIs, so a build against an older Kafka Streams (the
 * {@code .checkpoint} layout's proofs with 3.9 and 4.2) leaves that file out; its topology and summaries are
 * reached by name, and asking for them there is an error saying so.
 */
final class HeadersChoices {
    static final String HEADERS = "headers";
    static final String HLATEST = "hlatest";
    static final String HWLATEST = "hwlatest";
    static final String HSLATEST = "hslatest";
    private static final String TOPOLOGIES = "statestore.interop.HeadersTopologies";

    private HeadersChoices() {}

    /** The stores of the topology. */
    static final List<String> STORES =
            List.of(StreamsApp.COUNTS, StreamsApp.WCOUNTS, StreamsApp.SCOUNTS, HLATEST, HWLATEST, HSLATEST);

    /** Whether {@code name} is a store {@link HeadersTopologies} summarizes itself. */
    static boolean isOwnStore(String name) {
        return List.of(HLATEST, HWLATEST, HSLATEST).contains(name);
    }

    /**
     * The headers of input record {@code seq}: none for every third record, else {@code source: interop}, and for
     * every other of those also {@code seq: <seq>} and a header with a null value.
     */
    static void addHeaders(Headers headers, long seq) {
        if (seq % 3 == 0) {
            return;
        }
        headers.add("source", "interop".getBytes(StandardCharsets.UTF_8));
        if (seq % 3 == 2) {
            headers.add("seq", Long.toString(seq).getBytes(StandardCharsets.UTF_8));
            headers.add("none", null);
        }
    }

    /** {@link HeadersTopologies}' topology. */
    static Topology topology(String input, AtomicLong processed) throws Exception {
        return (Topology) call("topology", new Class<?>[] {String.class, AtomicLong.class}, input, processed);
    }

    /** {@link HeadersTopologies}' {@code STORE} line of its own store {@code name}. */
    static String summarize(KafkaStreams streams, String name, int keys, boolean print) throws Exception {
        return (String) call("summarize", new Class<?>[] {KafkaStreams.class, String.class, int.class, boolean.class},
                streams, name, keys, print);
    }

    private static Object call(String method, Class<?>[] types, Object... args) throws Exception {
        Class<?> c;
        try {
            c = Class.forName(TOPOLOGIES);
        } catch (ClassNotFoundException e) {
            throw new IllegalArgumentException("--stores headers needs Kafka Streams 4.3+: this build is against an "
                    + "older one", e);
        }
        Method m = c.getDeclaredMethod(method, types);
        m.setAccessible(true);
        try {
            return m.invoke(null, args);
        } catch (InvocationTargetException e) {
            throw e.getCause() instanceof Exception cause ? cause : e;
        }
    }
}
