/*
 * CuratorQueuePeer — a Curator InterProcessSemaphoreV2 (with its limit in a
 * SharedCount at <path>/count) and a Curator InterProcessReadWriteLock,
 * driven line by line on stdin, for the interop suite
 * tests/integration/test_interop_curator_queue.c.
 *
 *   java -cp <curator jars>:<dir> CuratorQueuePeer <connect> <path> sem <max>
 *   java -cp <curator jars>:<dir> CuratorQueuePeer <connect> <path> rw
 *
 * Commands, one per line; each answer is one line on stdout:
 *   acquire <qty> <ms>  semaphore: qty leases within ms -> "ACQUIRED <n>" | "TIMEOUT"
 *   release             semaphore: return every lease held -> "RELEASED <n>"
 *   count               semaphore: the SharedCount's value -> "COUNT <n>"
 *   racquire <ms>       read lock within ms  -> "ACQUIRED" | "TIMEOUT"
 *   rrelease            -> "RELEASED"
 *   wacquire <ms>       write lock within ms -> "ACQUIRED" | "TIMEOUT"
 *   wrelease            -> "RELEASED"
 *   children <sub>      children of <path>/<sub> ("." for <path>) -> "CHILDREN <n> <name>..."
 *   quit                close and exit 0
 * "READY" once connected (and the SharedCount started). Any failure prints
 * "ERROR <why>".
 */
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.shared.SharedCount;
import org.apache.curator.retry.RetryNTimes;

public final class CuratorQueuePeer {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: CuratorQueuePeer <connect> <path> sem <max> | rw");
            System.exit(64);
        }
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10000)
                .connectionTimeoutMs(5000)
                .retryPolicy(new RetryNTimes(3, 100))
                .build();
        client.start();
        if (!client.blockUntilConnected(10, TimeUnit.SECONDS)) {
            System.out.println("ERROR not connected");
            System.out.flush();
            System.exit(2);
        }
        String path = args[1];
        SharedCount count = null;
        InterProcessSemaphoreV2 sem = null;
        InterProcessReadWriteLock rw = null;
        if (args[2].equals("sem")) {
            count = new SharedCount(client, path + "/count", Integer.parseInt(args[3]));
            count.start();
            sem = new InterProcessSemaphoreV2(client, path, count);
        } else {
            rw = new InterProcessReadWriteLock(client, path);
        }
        List<Lease> leases = new ArrayList<>();
        System.out.println("READY");
        System.out.flush();

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split("\\s+");
            try {
                switch (w[0]) {
                case "acquire": {
                    Collection<Lease> got = sem.acquire(Integer.parseInt(w[1]), Long.parseLong(w[2]),
                            TimeUnit.MILLISECONDS);
                    if (got == null) {
                        System.out.println("TIMEOUT");
                    } else {
                        leases.addAll(got);
                        System.out.println("ACQUIRED " + got.size());
                    }
                    break;
                }
                case "release":
                    sem.returnAll(leases);
                    System.out.println("RELEASED " + leases.size());
                    leases.clear();
                    break;
                case "count":
                    System.out.println("COUNT " + count.getCount());
                    break;
                case "racquire":
                    System.out.println(rw.readLock().acquire(Long.parseLong(w[1]), TimeUnit.MILLISECONDS)
                            ? "ACQUIRED" : "TIMEOUT");
                    break;
                case "rrelease":
                    rw.readLock().release();
                    System.out.println("RELEASED");
                    break;
                case "wacquire":
                    System.out.println(rw.writeLock().acquire(Long.parseLong(w[1]), TimeUnit.MILLISECONDS)
                            ? "ACQUIRED" : "TIMEOUT");
                    break;
                case "wrelease":
                    rw.writeLock().release();
                    System.out.println("RELEASED");
                    break;
                case "children": {
                    String p = w[1].equals(".") ? path : path + "/" + w[1];
                    List<String> kids = client.getChildren().forPath(p);
                    Collections.sort(kids);
                    StringBuilder sb = new StringBuilder("CHILDREN " + kids.size());
                    for (String k : kids)
                        sb.append(' ').append(k);
                    System.out.println(sb);
                    break;
                }
                case "quit":
                    if (count != null)
                        count.close();
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
