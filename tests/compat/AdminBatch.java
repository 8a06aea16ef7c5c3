// Runs many pulsar-admin command lines through Pulsar's own PulsarAdminTool in one JVM:
// the same parsing, client calls and printing as `pulsar-admin`, without a JVM start per
// command. Each line of the input file is one command, its arguments separated by tabs;
// for each, one JSON line {"rc", "out", "err"} goes to stdout.
//
// Run with Java's source launcher: java -cp '<pulsar-admin-libs>/*' AdminBatch.java client.conf commands.tsv

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.FileInputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import org.apache.pulsar.admin.cli.PulsarAdminTool;

public class AdminBatch extends PulsarAdminTool {
    AdminBatch(Properties properties) throws Exception {
        super(properties);
    }

    int runCommand(String[] args) {
        return run(args) ? 0 : 1;
    }

    public static void main(String[] argv) throws Exception {
        Properties properties = new Properties();
        try (FileInputStream in = new FileInputStream(argv[0])) {
            properties.load(in);
        }
        PrintStream stdout = System.out;
        PrintStream stderr = System.err;
        ObjectMapper json = new ObjectMapper();
        for (String line : Files.readAllLines(Path.of(argv[1]), StandardCharsets.UTF_8)) {
            if (line.isEmpty()) {
                continue;
            }
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            ByteArrayOutputStream err = new ByteArrayOutputStream();
            System.setOut(new PrintStream(out, true, StandardCharsets.UTF_8));
            System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
            int rc;
            try {
                // A tool per command: picocli keeps option values between executions.
                rc = new AdminBatch(properties).runCommand(line.split("\t"));
            } catch (Exception e) {
                e.printStackTrace();
                rc = 2;
            } finally {
                System.out.flush();
                System.err.flush();
                System.setOut(stdout);
                System.setErr(stderr);
            }
            Map<String, Object> result = new LinkedHashMap<>();
            result.put("rc", rc);
            result.put("out", out.toString(StandardCharsets.UTF_8));
            result.put("err", err.toString(StandardCharsets.UTF_8));
            stdout.println(json.writeValueAsString(result));
        }
        stdout.flush();
        // PulsarAdminTool's own exit skips shutdown hooks too: the admin client's threads
        // would otherwise hold the JVM.
        Runtime.getRuntime().halt(0);
    }
}
