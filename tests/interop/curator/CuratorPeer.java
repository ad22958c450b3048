/*
 * CuratorPeer — a Curator InterProcessMutex driven line by line on stdin,
 * for the interop suite (tests/integration/test_interop_curator.c).
 *
 *   java -cp <curator jars>:<dir> CuratorPeer <connect> <lockPath> [user:password]
 *
 * Commands, one per line; each answer is one line on stdout:
 *   acquire <ms>   try for ms milliseconds  -> "ACQUIRED <node>" | "TIMEOUT"
 *   release        release the held lock    -> "RELEASED" | "ERROR <why>"
 *   children       the lock's children      -> "CHILDREN <n> <name>..."
 *   quit           close and exit 0
 * "READY" is printed once the client is connected. Any failure prints
 * "ERROR <why>" and, for a connection failure, exits 2. The lock is the
 * stock InterProcessMutex: the same layout Cerberus' zk engine speaks
 * (<lockPath>/_c_<uuid>-lock-<seq>), which is what the suite checks.
 */
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public final class CuratorPeer {
    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: CuratorPeer <connect> <lockPath> [user:password]");
            System.exit(64);
        }
        CuratorFrameworkFactory.Builder b = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10000)
                .connectionTimeoutMs(5000)
                .retryPolicy(new RetryNTimes(3, 100));
        if (args.length > 2)
            b.authorization("digest", args[2].getBytes(StandardCharsets.UTF_8));
        CuratorFramework client = b.build();
        client.start();
        if (!client.blockUntilConnected(10, TimeUnit.SECONDS)) {
            System.out.println("ERROR not connected");
            System.out.flush();
            System.exit(2);
        }
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        System.out.println("READY");
        System.out.flush();

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split("\\s+");
            try {
                switch (w[0]) {
                case "acquire":
                    if (mutex.acquire(Long.parseLong(w[1]), TimeUnit.MILLISECONDS)) {
                        List<String> kids = client.getChildren().forPath(args[1]);
                        Collections.sort(kids);
                        System.out.println("ACQUIRED " + kids);
                    } else {
                        System.out.println("TIMEOUT");
                    }
                    break;
                case "release":
                    mutex.release();
                    System.out.println("RELEASED");
                    break;
                case "children": {
                    List<String> kids = client.getChildren().forPath(args[1]);
                    StringBuilder sb = new StringBuilder("CHILDREN " + kids.size());
                    for (String k : kids)
                        sb.append(' ').append(k);
                    System.out.println(sb);
                    break;
                }
                case "quit":
                    client.close();
                    System.out.println("BYE");
                    System.out.flush();
                    System.exit(0);
                    break;
                default:
                    System.out.println("ERROR unknown command " + w[0]);
                }
            } catch (Exception ex) {
                System.out.println("ERROR " + ex);
            }
            System.out.flush();
        }
        client.close();
    }
}
