"""bench-spec's corpus (issue 60), written for it: texts a model on a device is asked to copy with
changes. Each task's prompt is its instruction, a blank line, then the text.

- ``PROOFREAD``: everyday paragraphs of 50-80 words with 3-6 misspellings each, to return corrected;
- ``REWRITE``: paragraphs in the present tense, to return in the past tense;
- ``EXTRACT``: short messages naming a person, a date, a place and an amount, to return as JSON;
- ``QUESTIONS``: free questions (bench-serve's), answered with nothing to copy.

For proofreading and rewriting the request's ``prediction`` is the text as given (OpenAI's advice for
Predicted Outputs: the answer is mostly the input).
"""

from __future__ import annotations

from .serve import QUESTIONS

PROOFREAD_INSTRUCTION = "Fix the spelling mistakes in this text and return the whole corrected text:"
REWRITE_INSTRUCTION = "Rewrite this text in the past tense, keeping everything else:"
EXTRACT_INSTRUCTION = (
    'Return a JSON object with the fields "name", "date", "place" and "amount" taken from this message:'
)

PROOFREAD = [
    "Every morning I walk my dog arond the park near our house. He likes to chase the ducks by the "
    "pond, but they always fly away before he gets close. Afterwards we stop at the bakery on the "
    "corner, where the owner gives him a small biscit. It has become our favorite part of the day, "
    "and I think he rememebers the way better than I do by now.",
    "Our kitchen sink started leaking last weak, so I called a plumber. He came on Tuesday and found "
    "that one of the pipes under the sink was crackd. It took him about an hour to replace it, and he "
    "also cheked the pipes in the bathroom while he was here. The bill was higher than I expected, "
    "but at least the floor is dry again.",
    "The library in our town is open untill eight in the evening on weekdays. I often go there after "
    "work to read the newspapers and borow a few books. The staff are very helpfull and always know "
    "which new novels have arrived. Last month they started a reading club that meets on Thursdays, "
    "and I have already made two new freinds there.",
    "We planted tomatos, beans and lettuce in the garden this spring. The lettuce grew quickly and we "
    "have been eating salads almost every day. The tomatos need more sun, so I moved the pots closer "
    "to the fence. My neighbour gave me some advise about watering them in the evening instead of "
    "the morning, and the plants look much healthier since then.",
    "My sister is getting maried in September at a small church by the sea. She wants only close "
    "family and a few freinds to be there, about forty guests in total. After the ceremony there will "
    "be a dinner at a restaurant on the harbour. I have been asked to give a short speach, which "
    "makes me more nervous than I would like to admit.",
    "The train to the city was delayed by almost an hour this morning becuase of a signal problem. "
    "Most people on the platform were calm, but a few were clearly late for important meetings. When "
    "the train finaly arrived it was very crowded, and I had to stand the whole way. Tomorrow I think "
    "I will take the earlier bus instead, just to be safe.",
    "Learning to play the guitar is harder than I thought it would be. My fingers hurt after every "
    "practise, and changing between chords still takes me too long. My teacher says this is normal "
    "and that it gets easier after a few weeks. I try to play for twenty minutes every evening, and "
    "slowly the songs are begining to sound like real music.",
    "Yesterday we visited the science musem with the children. They loved the room about space, "
    "where you can see a model of the solar system and touch a real piece of a meteorite. We also "
    "watched a short film about volcanos in the small cinema upstairs. By the end of the afternoon "
    "everyone was tired but very hapy, and they are already asking when we can go back.",
    "I have started cooking at home more often to save money. On Sundays I make a big pot of soup "
    "or a stew and keep it in the fridge for the week. It saves a lot of time in the evenings and I "
    "waste much less food than befor. My favourite recipe so far is a lentil soup with carrots, "
    "onions and a litle bit of lemon juice at the end.",
    "The weather forcast says it will rain all weekend, so our camping trip has been postponed. "
    "Instead we are planing to stay at home and finally sort out the garage. It is full of old "
    "boxes, broken chairs and toys the children no longer use. Anything that still works will go to "
    "the charity shop, and the rest will be taken to the recycling center on Monday.",
    "Our office moved to a new buliding in March. It is closer to the station and has much more "
    "light than the old one. The only problem is that the heating does not work properly yet, so "
    "many of us wear jumpers at our desks. The managment has promised that an engineer will fix it "
    "before the winter, but nobody is holding their breath.",
    "My grandmother turned ninety last Saturday and we organised a suprise party for her. Her "
    "friends from the village came, and my uncle travelled all the way from Canada to be there. She "
    "cried when she saw everyone in the living room. We ate cake, looked at old photographs and "
    "listened to her tell stories about her childhood on the farm untill late in the evening.",
    "Riding a bicycle to work has changed my mornings compleatly. It takes about twenty five minutes, "
    "which is almost the same as driving when the traffic is bad. I arrive feeling awake and in a "
    "good mood, and I no longer have to pay for parking. On rainy days I still take the bus, but I "
    "have bought a good jacket so that those days are becoming rarer.",
    "The new cafe on the high street serves the best coffee in town. They roast the beans themselfs "
    "in a small machine at the back of the shop. The cakes are made every morning by the owner's "
    "mother, and the lemon tart is especialy good. It gets very busy at lunchtime, so I usually go "
    "in the middle of the afternoon when it is quiter.",
    "Last winter our boiler broke down during the coldest week of the year. We had no hot water for "
    "three days and had to boil kettles to wash the dishes. The repair company was very busy and "
    "could not send anyone sooner. Since then we have the boiler serviced every autum, and we keep a "
    "small electric heater in the cupbord just in case.",
    "My son has just started at a new school and he was quite nervus on the first day. He did not "
    "know anyone in his class and worried that he would be lonley at lunch. When I picked him up in "
    "the afternoon he was smiling and told me about a boy who also likes dinosaurs. They have "
    "already agreed to sit together tomorow and swap their favourite books.",
    "We are trying to use less plastic at home this year. Instead of buying bottled water we now use "
    "a filter jug, and we take our own bags to the supermarkt. It was difficult to remember them at "
    "first, but now it has become a habit. The hardest part is food packaging, because almost "
    "everything in the shops is wraped in plastic of some kind.",
    "The swimming pool near my flat reopened after a long renovation. It now has a seperate lane for "
    "slow swimmers, which is perfect for me. I go twice a week before work, when it is almost empty "
    "and the water is still calm. After thirty lengths I feel ready for the day, and I sleep much "
    "better at night than I did befor I started.",
    "For my birthday my friends gave me a voucher for a pottery class. I had never made anything "
    "with clay before, and my first bowl colapsed on the wheel within a minute. The teacher was "
    "patient and showed me how to keep my hands steady. By the end of the evening I had made a small "
    "cup that is a little crooked but completly mine.",
    "Our street is organising a summer fair to raise money for the local playground. There will be "
    "stalls selling cakes, books and plants, and a band will play in the afternoon. Every house has "
    "been asked to help in some way, so I have offered to run the tombola. I still need to colect "
    "prizes, and I hope the weather stays dry for the whole day.",
]

REWRITE = [
    "Every Saturday my father gets up early and drives to the market. He buys fresh bread, cheese and "
    "whatever fruit is in season. On the way home he stops at the newsagent for a paper and a bag of "
    "sweets for the grandchildren. When he arrives, the whole family is usually still asleep, so he "
    "makes a pot of coffee and reads in the kitchen until we wake up.",
    "The museum opens at ten, and a small queue forms outside the doors long before that. Inside, the "
    "visitors go straight to the room with the old maps. A guide explains how sailors found their way "
    "across the sea without modern tools. Children press their noses against the glass cases, and "
    "their parents take photographs of the largest map on the wall.",
    "Maria works as a nurse in the children's ward of the city hospital. Her shifts start at seven in "
    "the morning and often end late in the evening. She checks on every patient, talks to the "
    "worried parents and writes careful notes for the doctors. On her days off she sleeps late, "
    "walks by the river and calls her mother in the village.",
    "Our team meets every Monday to plan the week. The manager shares the latest figures, and each "
    "person explains what they are working on. We list the problems that block us and decide who "
    "will help with each one. The meeting rarely lasts more than half an hour, and everyone leaves "
    "with a clear idea of what to do next.",
    "The farmer wakes before sunrise and feeds the animals. The cows wait by the gate, and the "
    "chickens run around his feet as he scatters the grain. After breakfast he repairs a fence in the "
    "far field and checks the water troughs. In the afternoon he drives the tractor to the village to "
    "collect seeds and a new pair of boots.",
    "The children build a snowman in the garden after school. They roll three large balls of snow and "
    "stack them on top of each other. Their mother gives them a carrot for the nose and two buttons "
    "for the eyes. When it gets dark they come inside with red cheeks and wet gloves and drink hot "
    "chocolate by the fire.",
    "The restaurant is full on Friday night. Waiters carry plates of pasta and grilled fish between "
    "the tables, and the kitchen is loud with pans and orders. A couple by the window celebrates "
    "their anniversary with a bottle of wine. At the end of the evening the chef comes out to thank "
    "the guests, and the staff share a late meal together.",
    "Tom trains for the city marathon all through the spring. He runs five times a week, with one "
    "long run on Sunday mornings. He eats more pasta, drinks plenty of water and goes to bed early. "
    "His knees hurt sometimes, so he sees a physiotherapist every two weeks. His friends promise to "
    "wait for him at the finish line with a banner.",
    "The storm reaches the coast in the early evening. The wind bends the trees and rain hits the "
    "windows in heavy waves. The lights in the village flicker and then go out. Families light "
    "candles and listen to the radio for news. By midnight the wind drops, and in the morning people "
    "come out to clear the branches from the roads.",
    "Anna moves into her first flat in the spring. It is small, with one bedroom and a tiny balcony "
    "that looks over the park. She paints the walls a pale green and buys a second-hand sofa from a "
    "neighbour. Her brother helps her carry the boxes up four floors, and they eat pizza on the floor "
    "because the table has not arrived yet.",
    "The school holds its science fair in the main hall. Students stand beside their projects and "
    "explain them to the judges. One group shows a model of a wind turbine, and another measures how "
    "quickly different plants grow in coloured light. The parents walk between the tables, ask "
    "questions and vote for their favourite project at the end of the day.",
    "Every evening the old man feeds the birds in the square. He brings a paper bag of seeds and sits "
    "on the same bench by the fountain. The pigeons know him and land on his shoulders and his hat. "
    "Tourists stop to take pictures, and he smiles and waves at them. When the bag is empty he folds "
    "it neatly and walks slowly home.",
    "The bakery opens at six, but the bakers start work at three in the morning. They mix the dough, "
    "shape the loaves and bake the croissants in large ovens. By the time the doors open, the shelves "
    "are full and the smell of bread fills the street. The first customers are usually builders and "
    "nurses on their way to work.",
    "Our company launches a new app in the autumn. The designers test every screen with real users, "
    "and the engineers fix the problems they find. The marketing team prepares short videos and "
    "writes to the newspapers. On launch day thousands of people download the app, and the support "
    "team answers questions late into the night.",
    "The village holds a festival every August. People hang flags across the streets, and a band "
    "plays in the square from noon until late. There are stalls with honey, cheese and handmade "
    "toys. In the evening everyone gathers by the river to watch the fireworks, and the children stay "
    "up far past their bedtime.",
    "Sara learns Spanish before her trip to Mexico. She uses an app on the bus every morning and "
    "takes a class on Wednesday evenings. Her teacher is patient and tells funny stories about her "
    "home town. Sara practises ordering food and asking for directions, and she watches films with "
    "subtitles at the weekend to get used to the sound of the language.",
    "The hikers leave the hut at dawn and follow the path along the ridge. The air is cold and clear, "
    "and they can see the lake far below. At noon they reach the summit and eat sandwiches in the "
    "shelter of a large rock. The descent takes longer than they expect, and they arrive back at the "
    "hut tired but proud just before dark.",
    "The city council repairs the old bridge over the river this summer. Workers close one lane and "
    "replace the rusty railings. Traffic moves slowly, and some drivers choose a longer road through "
    "the hills. The shops near the bridge see fewer customers, so the council gives them a small "
    "grant until the work is finished in September.",
    "My neighbour keeps bees in the corner of his garden. In the spring he checks the hives every "
    "week and looks for the queen. In the summer the bees are busy with the flowers along the lane. "
    "In September he collects the honey, fills dozens of jars and gives one to every house on our "
    "street with a handwritten label.",
    "The orchestra rehearses for the winter concert every Thursday. The violins practise the "
    "difficult passage again and again until it sounds right. The conductor stops them often and "
    "asks for more care with the quiet parts. On the night of the concert the hall is full, and the "
    "audience stands and applauds for several minutes at the end.",
]

EXTRACT = [
    "Hi, this is Laura Bennett. I would like to book the small meeting room at the Riverside Hotel "
    "for 14 March. We will pay the deposit of 150 euros by bank transfer this week.",
    "Dear team, Mark Olsen paid 42.50 dollars for the concert tickets on 2 June. The concert is at the "
    "City Hall, so please send the tickets to him before Friday.",
    "Reminder from Dr. Priya Shah: your dental check-up is on 9 October at the Green Street Clinic. "
    "The appointment costs 60 pounds, payable at the reception.",
    "Hello! Tom Becker here. I lost my wallet at Central Station on 21 January. It had about 80 "
    "euros in it and my bank cards. Please call me if someone hands it in.",
    "Invoice note: Sofia Marino ordered two chairs and a table for 325 euros on 5 April. Delivery is "
    "to her flat in Milan, next to the old market.",
    "Hi Anna, James Cooper will collect the rented van from the Northgate depot on 30 August. The "
    "rental is 95 pounds a day, and he will return it the next evening.",
    "Good morning, my name is Elena Petrova. I booked a table for six at Luigi's Trattoria on 17 "
    "May and paid a deposit of 40 euros. Could you add one more chair?",
    "Message for the school office: David Kim paid the school trip fee of 25 dollars on 3 February. "
    "The trip is to the Natural History Museum.",
    "Dear Sir, I am writing to confirm that Hannah Weber will attend the conference in Vienna on 11 "
    "November. Her registration fee of 210 euros has been paid in full.",
    "Hey, it's Carlos Ruiz. The plumber came to my house in Valencia on 8 July and fixed the boiler. "
    "He charged 120 euros, which I paid in cash.",
    "Notice: the yoga class led by Mia Jensen on 26 September will take place in the park pavilion "
    "instead of the studio. The price stays the same, 12 euros per person.",
    "Hello, I am Omar Haddad. I sent 500 dollars to my brother on 19 December through the bank on "
    "King Street. Please confirm that the transfer went through.",
    "Dear customer service, my name is Grace Liu. On 4 March I bought a coffee machine for 89 pounds "
    "at your Oxford Road shop, and it stopped working after a week.",
    "Hi all, Peter Novak is organising the team dinner on 15 December at the Blue Anchor pub. Each "
    "person pays 30 euros, which covers three courses and a drink.",
    "To whom it may concern: Fatima Noor rented a flat at 12 Harbour Lane in Lisbon from 1 June. The "
    "monthly rent is 780 euros, paid on the first day of each month.",
    "Quick note from Lucas Martin: I parked at the airport car park on 23 April and the ticket says "
    "I owe 64 euros for four days. Can the company refund it?",
    "Hello, this is Ingrid Larsen. The wedding photographer we hired for 27 July asks for 900 euros. "
    "The wedding will be at the old mill outside Bergen.",
    "Dear Mr. Brown, Aisha Bello's piano lessons start on 6 January at the music school on Park "
    "Avenue. Ten lessons cost 250 dollars, due before the first lesson.",
    "Hi, Daniel Green here. I donated 35 pounds to the animal shelter in Leeds on 12 August and "
    "would like a receipt for my tax return, please.",
    "Hi Chen Wei, your bicycle repair is ready. You can collect it from our shop on Market Square "
    "from 2 May. The repair came to 47 euros, and we accept cards.",
]


def prompts(task: str) -> list[dict]:
    """A task's requests: each its user message and, for proofreading and rewriting, its prediction."""
    if task == "free":
        return [{"message": q, "prediction": None} for q in QUESTIONS]
    instruction, texts = {
        "proofread": (PROOFREAD_INSTRUCTION, PROOFREAD),
        "rewrite": (REWRITE_INSTRUCTION, REWRITE),
        "extract": (EXTRACT_INSTRUCTION, EXTRACT),
    }[task]
    copies = task != "extract"
    return [{"message": f"{instruction}\n\n{text}", "prediction": text if copies else None} for text in texts]
