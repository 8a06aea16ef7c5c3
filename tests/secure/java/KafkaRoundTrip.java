// Kafka's Java client (Spark's Kafka source and sink use it) with the properties dwell
// gives it: args = properties file, topic, record count. Produces the records, reads them
// back in a fresh group, prints "round trip: <read> of <n>" and exits 0 when all came back.

import java.io.FileReader;
import java.time.Duration;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class KafkaRoundTrip {
    public static void main(String[] args) throws Exception {
        Properties base = new Properties();
        try (FileReader r = new FileReader(args[0])) {
            base.load(r);
        }
        String topic = args[1];
        int n = Integer.parseInt(args[2]);

        Properties p = new Properties();
        p.putAll(base);
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        p.put("delivery.timeout.ms", "60000");
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < n; i++) {
                producer.send(new ProducerRecord<>(topic, "k" + i, "v" + i)).get();
            }
        }

        Properties c = new Properties();
        c.putAll(base);
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        // Under the topic's name: with Kafka ACLs a user's groups share its topics' prefix.
        c.put("group.id", topic + "-round-trip-" + System.nanoTime());
        c.put("auto.offset.reset", "earliest");
        int read = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            consumer.subscribe(List.of(topic));
            long end = System.currentTimeMillis() + 30_000;
            while (read < n && System.currentTimeMillis() < end) {
                read += consumer.poll(Duration.ofMillis(500)).count();
            }
        }
        System.out.println("round trip: " + read + " of " + n);
        System.exit(read == n ? 0 : 1);
    }
}
