// A real JMS client (ActiveMQ's own, over OpenWire) for the adapter's tests, run as a
// single-file program: java -cp <activemq-client and deps> JmsClient.java <command> <queue> ...
//
//   produce <queue> <text> <idempotency-key>   send one persistent TextMessage with properties
//   rollback <queue> <max-redeliveries>        a transacted consumer that rolls back every
//                                              delivery; past the RedeliveryPolicy's limit the
//                                              client poison-acks and the broker dead-letters
//   consume <queue>                            print the next message's type, text and
//                                              properties (one line each), then commit
//
// Every receive is bounded (5 s); the exit code is 0 on success.
import java.util.Collections;
import javax.jms.*;
import org.apache.activemq.ActiveMQConnectionFactory;
import org.apache.activemq.RedeliveryPolicy;

public class JmsClient {
    public static void main(String[] args) throws Exception {
        ActiveMQConnectionFactory factory = new ActiveMQConnectionFactory("tcp://127.0.0.1:61616");
        RedeliveryPolicy policy = new RedeliveryPolicy();
        policy.setMaximumRedeliveries(args.length > 2 && args[0].equals("rollback") ? Integer.parseInt(args[2]) : 6);
        policy.setInitialRedeliveryDelay(0);
        policy.setRedeliveryDelay(0);
        factory.setRedeliveryPolicy(policy);
        Connection connection = factory.createConnection();
        try {
            connection.start();
            Session session = connection.createSession(true, Session.SESSION_TRANSACTED);
            Queue queue = session.createQueue(args[1]);
            switch (args[0]) {
                case "produce": {
                    TextMessage message = session.createTextMessage(args[2]);
                    message.setStringProperty("Idempotency-Key", args[3]);
                    message.setIntProperty("attempt", 1);
                    message.setJMSCorrelationID("jms-corr-1");
                    message.setJMSType("OrderPlaced");
                    session.createProducer(queue).send(message);
                    session.commit();
                    break;
                }
                case "rollback": {
                    MessageConsumer consumer = session.createConsumer(queue);
                    int deliveries = 0;
                    for (int i = 0; i < 50; i++) {
                        Message message = consumer.receive(deliveries == 0 ? 5000 : 1000);
                        if (message == null) break;
                        deliveries++;
                        session.rollback(); // processing failed
                    }
                    System.out.println("deliveries=" + deliveries);
                    break;
                }
                case "consume": {
                    Message message = session.createConsumer(queue).receive(5000);
                    if (message == null) { System.out.println("none"); System.exit(2); }
                    System.out.println("type=" + (message instanceof TextMessage ? "text" : message.getClass().getSimpleName()));
                    if (message instanceof TextMessage) System.out.println("text=" + ((TextMessage) message).getText());
                    for (Object name : Collections.list(message.getPropertyNames())) {
                        System.out.println("property." + name + "=" + message.getObjectProperty((String) name));
                    }
                    System.out.println("correlation=" + message.getJMSCorrelationID());
                    System.out.println("jmstype=" + message.getJMSType());
                    session.commit();
                    break;
                }
                default:
                    throw new IllegalArgumentException(args[0]);
            }
        } finally {
            connection.close();
        }
    }
}
