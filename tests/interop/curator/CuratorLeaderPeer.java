/*
 * CuratorLeaderPeer — Curator's LeaderLatch and LeaderSelector driven line
 * by line on stdin, for the election interop suite
 * (tests/integration/test_interop_curator_leader.c).
 *
 *   java -cp <curator jars>:<dir> CuratorLeaderPeer <connect> <electionPath>
 *
 * Commands, one per line; each answer is one line on stdout:
 *   latch <id>       start a LeaderLatch with participant id <id> -> "STARTED"
 *   await <ms>       wait for the latch's leadership -> "LEADER" | "TIMEOUT"
 *   has              the latch's hasLeadership() -> "LEADER" | "FOLLOWER"
 *   leader           LeaderLatch.getLeader() of the path (no latch of ours
 *                    needed) -> "LEADER_ID <id>" | "NONE"
 *   close            close the latch -> "CLOSED"
 *   selector <id>    start a LeaderSelector with id <id> -> "STARTED"; when
 *                    it takes leadership it prints "TAKEN" (at any time) and
 *                    keeps it until "resign"
 *   resign           end takeLeadership() -> "RESIGNED"
 *   sleader          the selector's getLeader() -> "LEADER_ID <id>" | "NONE"
 *   sclose           close the selector -> "CLOSED"
 *   quit             close everything and exit 0
 * "READY" is printed once the client is connected; a failure prints
 * "ERROR <why>" (exit 2 when not connected).
 */
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.retry.RetryNTimes;

public final class CuratorLeaderPeer {
    private static synchronized void say(String s) {
        System.out.println(s);
        System.out.flush();
    }

    private static String who(Participant p) {
        return p == null || !p.isLeader() ? "NONE" : "LEADER_ID " + p.getId();
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: CuratorLeaderPeer <connect> <electionPath>");
            System.exit(64);
        }
        final String path = args[1];
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10000)
                .connectionTimeoutMs(5000)
                .retryPolicy(new RetryNTimes(3, 100))
                .build();
        client.start();
        if (!client.blockUntilConnected(10, TimeUnit.SECONDS)) {
            say("ERROR not connected");
            System.exit(2);
        }
        say("READY");

        LeaderLatch latch = null;
        LeaderSelector selector = null;
        final Semaphore resign = new Semaphore(0);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split("\\s+");
            try {
                switch (w[0]) {
                case "latch":
                    latch = new LeaderLatch(client, path, w[1]);
                    latch.start();
                    say("STARTED");
                    break;
                case "await":
                    say(latch.await(Long.parseLong(w[1]), TimeUnit.MILLISECONDS) ? "LEADER" : "TIMEOUT");
                    break;
                case "has":
                    say(latch.hasLeadership() ? "LEADER" : "FOLLOWER");
                    break;
                case "leader":
                    say(who(new LeaderLatch(client, path).getLeader()));
                    break;
                case "close":
                    latch.close();
                    latch = null;
                    say("CLOSED");
                    break;
                case "selector":
                    selector = new LeaderSelector(client, path, new LeaderSelectorListenerAdapter() {
                        @Override
                        public void takeLeadership(CuratorFramework c) throws Exception {
                            say("TAKEN");
                            resign.acquire();
                        }
                    });
                    selector.setId(w[1]);
                    selector.start();
                    say("STARTED");
                    break;
                case "resign":
                    resign.release();
                    say("RESIGNED");
                    break;
                case "sleader":
                    say(who(selector.getLeader()));
                    break;
                case "sclose":
                    selector.close();
                    selector = null;
                    say("CLOSED");
                    break;
                case "quit":
                    if (latch != null)
                        latch.close();
                    if (selector != null)
                        selector.close();
                    client.close();
                    say("BYE");
                    System.exit(0);
                    break;
                default:
                    say("ERROR unknown command " + w[0]);
                }
            } catch (Exception ex) {
                say("ERROR " + ex);
            }
        }
        client.close();
    }
}
